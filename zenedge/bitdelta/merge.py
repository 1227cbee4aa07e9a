"""Merging 1-bit BitDelta entries under pressure (beyond the K-Merge paper, which only merges LoRAs).

Similarity of two deltas α_a⊙S_a and α_b⊙S_b is computed on the packed bits: per row,
⟨S_a, S_b⟩ = in − 2·popcount(bits_a XOR bits_b), so ⟨τ_a, τ_b⟩ = Σ_o α_a[o] α_b[o] (in − 2·h_o),
and ‖τ‖² = Σ_o α[o]²·in. K-Merge's measure is the mean over modules of the cosine.

The merge is dense OPCM (FusionBench semantics, `zenedge.merge.opcm.project_dense`), streamed one
module at a time so memory stays at a few [out, in] matrices: Ŝ = λ_{t−1}Δ_{t−1} + τ̃ per module,
re-binarised at once (sign(Ŝ/λ) = sign(Ŝ), α = mean|Ŝ|/λ), with λ_t = ‖Ŝ‖/mean‖τ‖ known only at the
end, so the packed signs stream to the output file and the small α vectors are scaled last.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from zenedge.bitdelta.fileformat import FORMAT_NAME, FORMAT_VERSION, SafetensorsStreamWriter, load_bitdelta, module_entry
from zenedge.bitdelta.packing import compress, decompress

_POPCOUNT = torch.tensor([bin(i).count("1") for i in range(256)], dtype=torch.int32)


def delta_norm(modules: dict[str, tuple[torch.Tensor, torch.Tensor, int]]) -> float:
    return math.sqrt(sum(float((alpha.double() ** 2).sum()) * in_f for _, alpha, in_f in modules.values()))


def delta_cosine(a: dict[str, tuple], b: dict[str, tuple]) -> float:
    """Mean over shared modules of cos(α_a⊙S_a, α_b⊙S_b), from the packed bits (no unpacking)."""
    cosines = []
    for name in sorted(set(a) & set(b)):
        (pa, aa, in_f), (pb, ab, _) = a[name], b[name]
        hamming = _POPCOUNT[torch.bitwise_xor(pa, pb).long()].sum(dim=1)
        # Padding bits beyond in_features are 0 in both: they never count as differences.
        agree = in_f - 2 * hamming.double()
        dot = float((aa.double() * ab.double() * agree).sum())
        norm = math.sqrt(float((aa.double() ** 2).sum()) * in_f * float((ab.double() ** 2).sum()) * in_f)
        cosines.append(dot / norm if norm else 0.0)
    return sum(cosines) / len(cosines) if cosines else 0.0


def merge_bitdelta_files(stored: Path, stored_state: dict[str, Any], incoming: Path, out: Path,
                         alpha: float = 0.5) -> dict[str, Any]:
    """OPCM-merge `incoming` into `stored` (continuing its state), re-binarised into `out`.
    Returns the new OPCM state (λ, task-vector norms)."""
    from zenedge.merge.opcm import project_dense

    a, b = load_bitdelta(stored), load_bitdelta(incoming)
    lam_prev = float(stored_state.get("lam", 1.0))
    norms = list(stored_state.get("norms") or [delta_norm(a.modules)]) + [delta_norm(b.modules)]
    mean_norm = sum(norms) / len(norms)
    writer = SafetensorsStreamWriter(out)
    try:
        alphas, entries, summed_sq = {}, [], 0.0
        for name in sorted(set(a.modules) | set(b.modules)):
            ref = a.modules.get(name) or b.modules[name]
            in_f, out_f = ref[2], ref[0].shape[0]
            delta = decompress(*a.modules[name]) if name in a.modules else torch.zeros(out_f, in_f)
            tau = decompress(*b.modules[name]) if name in b.modules else torch.zeros(out_f, in_f)
            summed = lam_prev * delta + project_dense(delta.double(), tau.double(), alpha).float()
            summed_sq += float(summed.double().square().sum())
            packed, row_alpha = compress(summed)
            writer.add(f"{name}.packed", packed)
            alphas[name] = row_alpha
            entries.append(module_entry(name, in_f, out_f))
        lam = math.sqrt(summed_sq) / mean_norm if mean_norm and summed_sq else 1.0
        for name, row_alpha in alphas.items():
            writer.add(f"{name}.alpha", (row_alpha / lam).float())
        writer.finish({"format": FORMAT_NAME, "format_version": str(FORMAT_VERSION),
                       "base_sha256": a.base_sha256, "modules": json.dumps(entries), "extra": "[]",
                       "merged": "opcm"})
    except BaseException:
        writer.close()
        raise
    return {"method": "opcm-dense-1bit", "alpha": alpha, "lam": lam, "norms": norms}
