"""The sign-packing contract: bit order, round trip, alpha, zeros, padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from zenedge.bitdelta.packing import compress, decompress, pack_signs, packed_width, unpack_signs

deltas = st.tuples(st.integers(1, 9), st.integers(1, 70)).flatmap(
    lambda shape: arrays(np.float32, shape, elements=st.one_of(
        st.just(0.0), st.floats(-4, 4, width=32, allow_nan=False, allow_subnormal=False))))


def test_bit_order_on_a_hand_written_row():
    # in = 9: byte 0 holds elements 0..7 (LSB first), byte 1 holds element 8 in bit 0.
    delta = torch.tensor([[1.0, -1.0, 0.0, 2.0, -3.0, 0.0, 0.0, 5.0, 7.0]])
    assert pack_signs(delta).tolist() == [[0b10001001, 0b00000001]]
    assert unpack_signs(pack_signs(delta), 9).tolist() == [[1, -1, -1, 1, -1, -1, -1, 1, 1]]


@settings(max_examples=60, deadline=None)
@given(deltas)
def test_round_trip_gives_the_sign_with_zero_as_minus_one(array):
    delta = torch.from_numpy(array)
    packed = pack_signs(delta)
    assert packed.dtype == torch.uint8 and packed.shape == (delta.shape[0], packed_width(delta.shape[1]))
    assert torch.equal(unpack_signs(packed, delta.shape[1]), torch.where(delta > 0, 1.0, -1.0))


@settings(max_examples=40, deadline=None)
@given(deltas)
def test_padding_bits_are_zero(array):
    delta = torch.from_numpy(array)
    in_features = delta.shape[1]
    if in_features % 8:
        last = pack_signs(delta)[:, -1].int()
        assert (last >> (in_features % 8) == 0).all()


@settings(max_examples=40, deadline=None)
@given(deltas)
def test_alpha_is_the_row_mean_of_abs_delta(array):
    delta = torch.from_numpy(array)
    packed, alpha = compress(delta)
    assert alpha.dtype == torch.float32 and alpha.shape == (delta.shape[0],)
    assert torch.allclose(alpha, delta.abs().double().mean(1).float(), rtol=1e-6, atol=1e-7)
    assert torch.equal(packed, pack_signs(delta))


def test_all_zero_delta_packs_to_minus_one_with_zero_alpha():
    packed, alpha = compress(torch.zeros(3, 11))
    assert (packed == 0).all() and (alpha == 0).all()
    assert (unpack_signs(packed, 11) == -1).all()


def test_bf16_delta_and_unpack_dtype():
    delta = torch.randn(4, 20).bfloat16()
    packed, alpha = compress(delta)
    assert alpha.dtype == torch.float32
    signs = unpack_signs(packed, 20, dtype=torch.float16)
    assert signs.dtype == torch.float16 and torch.equal(signs.float(), torch.where(delta > 0, 1.0, -1.0))
    assert torch.allclose(decompress(packed, alpha, 20), signs.float() * alpha[:, None])


def test_batched_unpack_keeps_leading_dims():
    packed = torch.stack([pack_signs(torch.randn(5, 12)) for _ in range(3)])
    assert unpack_signs(packed, 12).shape == (3, 5, 12)


def test_bad_inputs_raise_value_errors():
    with pytest.raises(ValueError):
        pack_signs(torch.randn(8))
    with pytest.raises(ValueError):
        unpack_signs(torch.zeros(2, 3, dtype=torch.uint8), 30)
    with pytest.raises(ValueError):
        unpack_signs(torch.zeros(2, 3, dtype=torch.int32), 24)
