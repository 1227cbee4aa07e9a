"""Row grouping: correct segments and slots, and no host sync (it runs on the meta device)."""

from __future__ import annotations

import pytest
import torch

from zenedge.kernels.bitdelta.grouping import DeltaIdError, group_rows


def test_segments_and_slots_for_a_mixed_batch():
    g = group_rows(torch.tensor([2, -1, 0, 2, 2]), 4)
    assert g.perm.tolist() == [1, 2, 0, 3, 4]                    # stable within a segment
    assert g.seg_start.tolist() == [0, 1, 2, 2, 5, 5]           # base, d0, d1 (empty), d2, d3 (empty)
    # Delta slots only (base rows need none), compacted; min(D, M) = 4 of them, unused ones dead.
    assert g.slots.tolist() == [[0, 1, 2], [2, 2, 5], [-1, 0, 0], [-1, 0, 0]]
    assert g.num_slots == 4


def test_every_row_lands_in_the_segment_of_its_id():
    ids = torch.randint(-1, 6, (97,), generator=torch.Generator().manual_seed(1))
    g = group_rows(ids, 6)
    starts = g.seg_start.tolist()
    for seg in range(7):
        rows = g.perm[starts[seg]:starts[seg + 1]].long()
        assert (ids[rows] == seg - 1).all()
    assert sorted(g.perm.tolist()) == list(range(97))


def test_grouping_needs_no_host_sync():
    # Meta tensors have no values: any .item()/bincount-style sync would raise here.
    g = group_rows(torch.empty(9, dtype=torch.int64, device="meta"), 3, validate=False)
    assert g.perm.shape == (9,) and g.seg_start.shape == (5,) and g.slots.shape == (3, 3)


@pytest.mark.parametrize("ids", [[0, 3], [-2, 0]])
def test_out_of_range_ids_are_rejected_on_cpu(ids):
    with pytest.raises(DeltaIdError):
        group_rows(torch.tensor(ids), 3)
