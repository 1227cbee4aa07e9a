"""Merge math for the pool: similarity, OPCM (dense and low-rank), baseline merge methods.

Pure tensor-in, tensor-out: nothing here knows about the store, files or models. An adapter
is `dict[str, LoraFactors]` (module name → A[r, in], B[out, r], scale), ΔW = scale·B·A.
See README.md beside this file for the map of modules.
"""

from zenedge.merge.factors import Adapter, LoraFactors, adapter_norm
from zenedge.merge.lowrank_opcm import (
    LowRankOPCMState,
    lowrank_opcm_fold,
    lowrank_opcm_init,
    lowrank_opcm_step,
)
from zenedge.merge.methods import MERGE_METHODS, merge
from zenedge.merge.opcm import OPCMState, opcm_fold, opcm_init, opcm_merge, opcm_step
from zenedge.merge.product_svd import TruncationReport
from zenedge.merge.result import MergeResult
from zenedge.merge.similarity import SimilarityIndex, lora_cosine, module_cosines, rank_by_similarity

__all__ = [
    "Adapter",
    "LoraFactors",
    "adapter_norm",
    "lora_cosine",
    "module_cosines",
    "rank_by_similarity",
    "SimilarityIndex",
    "OPCMState",
    "opcm_init",
    "opcm_step",
    "opcm_fold",
    "opcm_merge",
    "LowRankOPCMState",
    "lowrank_opcm_init",
    "lowrank_opcm_step",
    "lowrank_opcm_fold",
    "MERGE_METHODS",
    "merge",
    "MergeResult",
    "TruncationReport",
]
