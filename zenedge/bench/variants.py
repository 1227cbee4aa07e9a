"""The variants the benchmark serves, made on the spot for whatever base it runs on: PEFT LoRA
adapters (r=8 on q/k/v/o, random non-zero B, saved by PEFT itself) and BitDelta deltas (random
signs and row scales in zenedge.bitdelta's file format), both made from the base's shapes alone,
so that a bench at 8B holds no model beside the residents it measures.
Their quality is irrelevant here; their shapes, formats and load paths are the real ones."""

from __future__ import annotations

import json
from pathlib import Path

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def make_lora(base_dir: Path, out: Path, *, seed: int, rank: int = 8) -> Path:
    """A PEFT LoRA directory (adapter_config.json + adapter_model.safetensors), saved by PEFT. The
    base is a skeleton on the meta device (its shapes, no weights: an 8B base in fp32 would be
    30 GB); only the adapter's factors are real: A as PEFT initialises it, B random non-zero."""
    import math

    import torch
    from peft import LoraConfig, get_peft_model
    from torch import nn

    from zenedge.runtime.model import skeleton

    torch.manual_seed(seed)
    peft_model = get_peft_model(skeleton(base_dir), LoraConfig(r=rank, lora_alpha=2 * rank,
                                                                target_modules=LORA_TARGETS, lora_dropout=0.0))
    for name, module in peft_model.named_modules():
        if isinstance(module, nn.Linear) and (".lora_A." in name or ".lora_B." in name):
            weight = torch.empty(module.weight.shape)
            if ".lora_A." in name:
                nn.init.kaiming_uniform_(weight, a=math.sqrt(5))      # PEFT's own init of A
            else:           # PEFT starts B at zero: a no-op adapter would flatter nothing
                weight.normal_(0, 0.01)
            module.weight = nn.Parameter(weight)
    peft_model.save_pretrained(out)
    return out


def make_bitdelta(base_dir: Path, out: Path, *, seed: int, scale: float = 2e-3,
                  base_sha256: str | None = None) -> Path:
    """A .bitdelta file of random signs on every decoder projection of the base, each row scaled
    by `scale`·√(2/π) (what compressing base + scale·N(0,1) gives), written tensor by tensor from
    the base's shapes alone: no model in memory at any size. `base_sha256`: the base's digest as
    a store knows it, else the checkpoint's own."""
    import json
    import math

    import torch

    from zenedge.bitdelta.compressor import _checkpoint, is_projection
    from zenedge.bitdelta.fileformat import FORMAT_NAME, FORMAT_VERSION, SafetensorsStreamWriter, module_entry
    from zenedge.bitdelta.packing import pack_signs
    from zenedge.digests import checkpoint_sha256

    generator = torch.Generator().manual_seed(seed)
    base = _checkpoint(base_dir)
    writer = SafetensorsStreamWriter(out)
    modules, full, bits = [], 0, 0
    try:
        for name in sorted(base.where):
            shape = base.shape(name)
            if not is_projection(name, shape):
                continue
            signs = torch.randint(0, 2, shape, generator=generator, dtype=torch.int8) * 2 - 1
            module = name.removesuffix(".weight")
            bits += writer.add(f"{module}.packed", pack_signs(signs))
            bits += writer.add(f"{module}.alpha", torch.full((shape[0],), scale * math.sqrt(2 / math.pi)))
            full += shape[0] * shape[1] * 2
            modules.append(module_entry(module, shape[1], shape[0]))
        writer.finish({"format": FORMAT_NAME, "format_version": str(FORMAT_VERSION),
                       "base_sha256": base_sha256 or checkpoint_sha256(base.files), "modules": json.dumps(modules),
                       "extra": "[]", "source_dtype": "bfloat16", "bytes_full_delta": str(full),
                       "bytes_bitdelta": str(bits), "bytes_extra": "0"})
    except BaseException:
        writer.close()
        raise
    finally:
        base.close()
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

