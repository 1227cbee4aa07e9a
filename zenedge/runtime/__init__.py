"""Inference: one resident base, variants (LoRA, BitDelta, merged) applied per batch row."""
