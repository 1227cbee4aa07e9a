"""BitDelta: 1-bit deltas (packed signs + per-row scale) of fine-tuned models against a base.

- packing:     pack_signs / unpack_signs / compress (the format contract)
- fileformat:  the .bitdelta safetensors file, load_bitdelta / save_bitdelta, BitDeltaFile
- compressor:  compress_model (stream two checkpoints into one .bitdelta file)
- distill:     distill_scales (train the alphas against the fine-tuned logits)
- calibration: offline calibration batches
Names load lazily, so ``import zenedge.bitdelta.errors`` stays torch-free.
"""

from __future__ import annotations

from zenedge.lazy_exports import lazy_exports

_EXPORTS = {
    "pack_signs": "packing", "unpack_signs": "packing", "compress": "packing", "decompress": "packing",
    "packed_width": "packing",
    "BitDeltaFile": "fileformat", "load_bitdelta": "fileformat", "save_bitdelta": "fileformat",
    "FORMAT_VERSION": "fileformat",
    "compress_model": "compressor", "CompressionReport": "compressor",
    "distill_scales": "distill", "DistillResult": "distill", "apply_bitdelta": "distill", "with_alphas": "distill",
    "build_calibration_batches": "calibration", "stdlib_texts": "calibration",
    "BitDeltaError": "errors", "BitDeltaFormatError": "errors", "CheckpointMismatch": "errors",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
