"""Tiny random llama checkpoints (base and a perturbed fine-tune) saved as safetensors dirs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tiny_model(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**TINY)).eval()


def save_checkpoint(model, directory: Path, shards: int = 1) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(directory)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if shards == 1:
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    else:
        names = sorted(state)
        for i in range(shards):
            part = {k: state[k] for k in names[i::shards]}
            save_file(part, str(directory / f"model-{i + 1:05d}-of-{shards:05d}.safetensors"), metadata={"format": "pt"})
    return directory


def fine_tune(base, scale: float = 0.02, seed: int = 1):
    """A 'fine-tuned' copy: every projection perturbed, one norm changed, embeddings untouched."""
    import copy

    tuned = copy.deepcopy(base)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in tuned.named_parameters():
            if name.endswith(".weight") and any(p in name for p in PROJECTIONS):
                param.add_(torch.randn(param.shape, generator=gen) * scale)
        tuned.model.layers[1].post_attention_layernorm.weight.mul_(1.5)
    return tuned


@pytest.fixture()
def checkpoints(tmp_path):
    base = tiny_model()
    tuned = fine_tune(base)
    return base, tuned, save_checkpoint(base, tmp_path / "base"), save_checkpoint(tuned, tmp_path / "tuned")
