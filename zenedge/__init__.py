"""zenedge: one resident base model, many LoRA / 1-bit BitDelta variants in a storage budget."""

__version__ = "0.1.0"
