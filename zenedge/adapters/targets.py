"""Which base modules a variant may change: the attention and MLP projections of the decoder
layers, the modules the runtime swaps for per-row VariantLinears. An adapter that targets anything
else (lm_head, embeddings, a vision tower) is refused at import, never silently half-applied."""

from __future__ import annotations

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def is_servable(module: str) -> bool:
    return module.rsplit(".", 1)[-1] in PROJECTIONS and ".layers." in f".{module}"
