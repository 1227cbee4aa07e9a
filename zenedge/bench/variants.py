"""The variants the benchmark serves, made on the spot for whatever base it runs on: PEFT LoRA
adapters (r=8 on q/k/v/o, random non-zero B, saved by PEFT itself) and BitDelta deltas
(compressed with zenedge.bitdelta from a perturbed copy of the base saved by transformers).
Their quality is irrelevant here; their shapes, formats and load paths are the real ones."""

from __future__ import annotations

import json
from pathlib import Path

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def make_lora(base_dir: Path, out: Path, *, seed: int, rank: int = 8) -> Path:
    """A PEFT LoRA directory (adapter_config.json + adapter_model.safetensors)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from zenedge.runtime.model import load_causal_lm

    torch.manual_seed(seed)
    model = load_causal_lm(base_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=LORA_TARGETS,
                                                  lora_dropout=0.0))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:      # PEFT starts B at zero: a no-op adapter would flatter nothing
                param.normal_(0, 0.01)
    peft_model.save_pretrained(out)
    return out


def make_bitdelta(base_dir: Path, work: Path, out: Path, *, seed: int, scale: float = 2e-3,
                  base_sha256: str | None = None) -> Path:
    """A .bitdelta file: base + scale·N(0,1) on every decoder 2-D weight, compressed (`base_sha256`:
    the base's digest as a store knows it, else the compressor's own)."""
    import torch
    from zenedge.runtime.model import load_causal_lm

    from zenedge.bitdelta import compress_model

    torch.manual_seed(seed)
    model = load_causal_lm(base_dir, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 2 and ".layers." in name:
                param.add_(scale * torch.randn_like(param))
    tuned = work / f"finetuned-{seed}"
    save_weights(model, tuned)
    compress_model(base_dir, tuned, out, base_sha256=base_sha256)
    return out


def save_weights(model, out: Path) -> Path:
    """The model's weights as one safetensors file (what the compressor reads). Not
    `save_pretrained`: a model transformers loaded from a GGUF file refuses it."""
    from safetensors.torch import save_file

    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)          # the embedding's own tensor
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def load_lora_variant(key: str, directory: Path, device, dtype):
    from zenedge.runtime.variants import load_lora

    config = json.loads((directory / "adapter_config.json").read_text())
    return load_lora(key, "lora", directory / "adapter_model.safetensors", config, device, dtype)

