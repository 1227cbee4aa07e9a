"""Group the rows of a mixed-delta batch by delta id, on the tensors' own device, with no host sync.

Computed once per batch and reused by every layer: the fused kernel reads each delta's sign bits
once per tile because its rows are contiguous after this permutation. Everything here is plain
torch with static output shapes (sort, searchsorted, index_put), so it can be captured in a CUDA
graph: no .item(), no bincount (which syncs on CUDA to size its output).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class DeltaIdError(ValueError):
    """delta_ids hold a value outside [-1, num_deltas)."""


@dataclass(frozen=True)
class RowGrouping:
    """Rows sorted by delta id. Segment s holds delta s-1; segment 0 holds base-only rows (id -1).

    perm:      int32 [M]        sorted position -> original row (stable within a segment)
    seg_start: int32 [D+2]      segment s covers sorted rows [seg_start[s], seg_start[s+1])
    slots:     int32 [S, 3]     (delta id, lo, hi) of the non-empty delta segments (base rows need
                                no slot: every row gets the base product), compacted; unused slots
                                are (-1, 0, 0). S = max(1, min(D, M)): every possible delta fits.
    """

    perm: torch.Tensor
    seg_start: torch.Tensor
    slots: torch.Tensor
    num_rows: int
    num_deltas: int

    @property
    def num_slots(self) -> int:
        return self.slots.shape[0]


def group_rows(delta_ids: torch.Tensor, num_deltas: int, *, validate: bool | None = None) -> RowGrouping:
    """Sort rows by ``delta_ids`` (int, [M], -1 = base only) for ``num_deltas`` deltas.

    ``validate`` checks the id range; it needs a host sync, so it defaults to on for CPU tensors
    and off for CUDA ones (call once per batch with ``validate=True`` in eager code if unsure).
    Rows with out-of-range ids are left outside every segment and their outputs are not written.
    """
    if delta_ids.dim() != 1:
        raise DeltaIdError(f"delta_ids must be 1-D [M], got shape {tuple(delta_ids.shape)}")
    if num_deltas < 1:
        raise DeltaIdError(f"num_deltas must be >= 1, got {num_deltas}")
    if validate is None:
        validate = delta_ids.device.type == "cpu"
    if validate and delta_ids.numel():
        lo, hi = int(delta_ids.min()), int(delta_ids.max())
        if lo < -1 or hi >= num_deltas:
            raise DeltaIdError(f"delta_ids must lie in [-1, {num_deltas}), got range [{lo}, {hi}]")

    device = delta_ids.device
    m = delta_ids.shape[0]
    ids = delta_ids.to(torch.int32)
    sorted_ids, perm = torch.sort(ids, stable=True)                         # [M], [M]
    bounds = torch.arange(-1, num_deltas + 1, dtype=torch.int32, device=device)   # [D+2]
    seg_start = torch.searchsorted(sorted_ids, bounds).to(torch.int32)     # rows with id < bound

    num_slots = max(1, min(num_deltas, m))
    lo, hi = seg_start[1:-1], seg_start[2:]                                 # [D] each: delta segments
    nonempty = hi > lo
    order = torch.cumsum(nonempty.to(torch.int32), 0) - 1                   # slot of each segment
    dest = torch.where(nonempty & (order < num_slots), order, num_slots)    # extra row = discard
    seg_ids = torch.arange(0, num_deltas, dtype=torch.int32, device=device)
    values = torch.stack([seg_ids, lo, hi], dim=1)                          # [D, 3]
    slots = torch.zeros(num_slots + 1, 3, dtype=torch.int32, device=device)
    slots[:, 0] = -1
    slots.index_put_((dest.to(torch.int64),), values)                      # duplicates only hit discard
    return RowGrouping(perm=perm.to(torch.int32), seg_start=seg_start, slots=slots[:num_slots].contiguous(),
                       num_rows=m, num_deltas=num_deltas)
