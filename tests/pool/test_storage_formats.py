"""The formats stored LoRA factors take (adapters/storage.py): what each keeps, how the file
describes itself, and that every reader (the runtime, merges, export) reads it back."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from zenedge.adapters import storage
from zenedge.adapters.lora_tensors import read_lora_factors, round_to, stored_format, write_peft_adapter
from zenedge.merge.factors import LoraFactors


def factors(seed: int, out: int = 96, inputs: int = 64, rank: int = 4, scale: float = 2.0) -> dict[str, LoraFactors]:
    g = torch.Generator().manual_seed(seed)
    return {"model.layers.0.self_attn.q_proj": LoraFactors(torch.randn(rank, inputs, generator=g) * 0.02,
                                                            torch.randn(out, rank, generator=g) * 0.01, scale),
            "model.layers.0.self_attn.k_proj": LoraFactors(torch.randn(rank, inputs, generator=g) * 0.02,
                                                            torch.randn(out // 2 + 3, rank, generator=g) * 0.01, scale)}


def relative_error(a: dict[str, LoraFactors], b: dict[str, LoraFactors]) -> float:
    num = sum(float((a[m].delta() - b[m].delta()).norm()) ** 2 for m in a)
    den = sum(float(a[m].delta().norm()) ** 2 for m in a)
    return (num / den) ** 0.5


@pytest.mark.parametrize("fmt, bound", [("fp32", 1e-7), ("fp16", 1e-3), ("bf16", 1e-2), ("int8", 0.03), ("int4", 0.3)])
def test_each_format_reads_back_as_written_and_as_the_gate_measured_it(tmp_path, fmt, bound):
    original = factors(0)
    config = write_peft_adapter(original, tmp_path, base_model="tiny", storage_format=fmt)
    weights = tmp_path / "adapter_model.safetensors"
    back = read_lora_factors(weights, config, dtype=torch.float32)
    assert stored_format(weights) == fmt
    assert relative_error(original, back) < bound
    # What a gate scores (round_to) is exactly what the stored file serves.
    simulated = round_to(original, fmt)
    for module in original:
        assert torch.equal(simulated[module].delta(), back[module].delta())


def test_smaller_formats_take_fewer_bytes_and_describe_themselves(tmp_path):
    sizes = {}
    for fmt in ("fp32", "bf16", "int8", "int4"):
        write_peft_adapter(factors(1, out=512, inputs=512, rank=8), tmp_path / fmt, base_model="tiny", storage_format=fmt)
        sizes[fmt] = (tmp_path / fmt / "adapter_model.safetensors").stat().st_size
    assert sizes["fp32"] > sizes["bf16"] > sizes["int8"] > sizes["int4"]
    assert sizes["int4"] < 0.35 * sizes["bf16"] and sizes["int8"] < 0.55 * sizes["bf16"]
    with safe_open(str(tmp_path / "int4" / "adapter_model.safetensors"), framework="pt") as handle:
        meta = handle.metadata()
        key = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
        assert meta["zenedge.storage"] == "int4" and meta["zenedge.group"] == "32"
        assert handle.get_tensor(key).dtype == torch.uint8 and handle.get_tensor(key).shape == (8, 256)  # Bᵀ, 2 per byte
        assert handle.get_tensor(key + ".scale").dtype == torch.bfloat16


@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4"])
def test_the_same_factors_always_give_the_same_bytes(tmp_path, fmt):
    """The pool names an adapter by its file's sha256: the same content must give the same file
    (safetensors writes its metadata in hash-map order; the writer sorts the header)."""
    from safetensors.torch import load_file

    from zenedge.adapters.safetensors_file import read_header

    files = []
    for attempt in range(6):
        write_peft_adapter(factors(3), tmp_path / str(attempt), base_model="tiny", storage_format=fmt)
        files.append((tmp_path / str(attempt) / "adapter_model.safetensors").read_bytes())
    assert len(set(files)) == 1
    weights = tmp_path / "0" / "adapter_model.safetensors"
    header = read_header(weights)    # what the pool validates: offsets, sizes, no trailing bytes
    assert header.data_start % 8 == 0 and header.metadata["format"] == "pt"
    assert set(load_file(weights)) == set(header.tensors)


def test_rows_that_are_not_a_whole_number_of_groups_are_padded_and_cut_back(tmp_path):
    original = factors(2, out=70, inputs=45)   # 45 inputs, 70 and 38 outputs: none a multiple of 32
    config = write_peft_adapter(original, tmp_path, base_model="tiny", storage_format="int4")
    with safe_open(str(tmp_path / "adapter_model.safetensors"), framework="pt") as handle:
        assert json.loads(handle.metadata()["zenedge.columns"])  # the true lengths are recorded
    back = read_lora_factors(tmp_path / "adapter_model.safetensors", config, dtype=torch.float32)
    for module, f in original.items():
        assert back[module].A.shape == f.A.shape and back[module].B.shape == f.B.shape
    assert relative_error(original, back) < 0.3


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 6), cols=st.integers(1, 80), bits=st.sampled_from([4, 8]),
       magnitude=st.floats(1e-6, 1e3), seed=st.integers(0, 2**16))
def test_quantization_error_is_at_most_half_a_step_of_its_scale(rows, cols, bits, magnitude, seed):
    values = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * magnitude
    spec = storage.Quantized(bits, 32 if bits == 4 else None)
    codes, scales, padded = storage.quantize(values, spec)
    back = storage.dequantize(codes, scales, spec, cols)
    assert back.shape == values.shape and padded % (spec.group or cols) == 0
    group = spec.group or padded
    step = scales.float().repeat_interleave(group, dim=1)[:, :cols]
    assert bool((back - values).abs().le(step / 2 * (1 + 1e-3) + 1e-30).all())


def test_all_zero_factors_stay_zero():
    spec = storage.QUANTIZED["int4"]
    codes, scales, _ = storage.quantize(torch.zeros(2, 64), spec)
    assert torch.equal(storage.dequantize(codes, scales, spec, 64), torch.zeros(2, 64))


def test_the_pool_steps_down_only_to_smaller_formats_within_its_limit():
    assert storage.smaller_than("fp32", "int4") == ["bf16", "int8", "int4"]
    assert storage.smaller_than("bf16", "int4") == ["int8", "int4"]
    assert storage.smaller_than("fp16", "int8") == ["int8"]
    assert storage.smaller_than("int4", "int4") == [] and storage.smaller_than("bf16", "bf16") == []


def test_a_damaged_quantized_file_is_a_clear_error(tmp_path):
    from safetensors.torch import load_file, save_file

    from zenedge.errors import InvalidAdapter

    config = write_peft_adapter(factors(3), tmp_path, base_model="tiny", storage_format="int8")
    path = tmp_path / "adapter_model.safetensors"
    tensors = load_file(path)
    del tensors[next(k for k in tensors if k.endswith(".scale"))]
    save_file(tensors, str(path), metadata={"format": "pt", "zenedge.storage": "int8", "zenedge.group": "0"})
    with pytest.raises(InvalidAdapter, match="damaged quantized"):
        read_lora_factors(path, config)
