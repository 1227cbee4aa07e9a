"""Merge math for the pool: similarity, OPCM (dense and low-rank), baseline merge methods.

Pure tensor-in, tensor-out: nothing here knows about the store, files or models. An adapter
is `dict[str, LoraFactors]` (module name → A[r, in], B[out, r], scale), ΔW = scale·B·A.
See README.md beside this file for the map of modules. Names load lazily, so the table of
methods (`methods.py`) and the errors stay torch-free.
"""

from __future__ import annotations

from zenedge.lazy_exports import lazy_exports

_EXPORTS = {
    "Adapter": "factors", "LoraFactors": "factors", "adapter_norm": "factors",
    "lora_cosine": "similarity", "rank_by_similarity": "similarity",
    "SimilarityIndex": "similarity",
    "OPCMState": "opcm", "opcm_init": "opcm", "opcm_step": "opcm", "opcm_fold": "opcm",
    "LowRankOPCMState": "lowrank_opcm", "lowrank_opcm_init": "lowrank_opcm", "lowrank_opcm_step": "lowrank_opcm",
    "lowrank_opcm_fold": "lowrank_opcm",
    "MERGE_METHODS": "methods", "merge": "methods",
    "MergeResult": "result", "TruncationReport": "product_svd",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
