"""Weight-only int8 / int4 CPU copies: the kernels (torch's, and zenedge's C kernel for int4)
multiply by what the quantizer says they do, rounding stays within the format's step, shapes a
kernel cannot take stay plain, and a resident served from int4 copies densifies BitDelta in int4
too (giving a model its copies: test_transforms.py)."""

import pytest
import torch

from zenedge.kernels import native
from zenedge.runtime import cpu_weights
from zenedge.runtime.cpu_weights import Int4Weight, Int8Weight, NativeInt4Weight, OneDnnBF16, fast_copy
from zenedge.runtime.dense_bitdelta import dense_nbytes, densify
from zenedge.runtime.model import load_resident

CPU = torch.device("cpu")
needs = {fmt: pytest.mark.skipif(not cpu_weights.quantized_kernels_available(fmt), reason=f"no {fmt} CPU kernel")
         for fmt in ("int8", "int4")}
needs["native"] = pytest.mark.skipif(native.int4_gemm() is None, reason="no native int4 kernel on this machine")
INT4 = (Int4Weight, NativeInt4Weight)


@pytest.mark.parametrize("kind", [pytest.param(Int8Weight, marks=needs["int8"]), pytest.param(Int4Weight, marks=needs["int4"]),
                                  pytest.param(NativeInt4Weight, marks=needs["native"])])
def test_the_kernel_multiplies_by_the_dequantized_weight(kind):
    torch.manual_seed(0)
    weight = torch.randn(48, 128) * 0.05 if kind is NativeInt4Weight else torch.randn(48, 96) * 0.05
    fast = kind(weight)
    x = torch.randn(5, weight.shape[1])
    deq = fast.dequantized()
    # Within the format's step: half a code per element (int8: per row; int4: per 32-input group),
    # plus bf16 rounding of the scales (2^-8 relative).
    if kind is Int8Weight:
        step = weight.abs().amax(1, keepdim=True) / 127
    else:
        groups = weight.view(weight.shape[0], -1, 32)
        step = ((groups.amax(-1) - groups.amin(-1)) / 15).repeat_interleave(32, dim=1)
    assert ((deq - weight).abs() <= step / 2 + 0.01 * step + 0.01 * weight.abs()).all()
    got = fast.linear(x, None)
    want = x.bfloat16().float() @ deq.t()
    assert got.dtype == torch.float32                                  # back in the activations' dtype
    assert (got - want).abs().max() < 0.02 * want.abs().max()
    assert fast.nbytes < weight.numel() * (1.1 if kind is Int8Weight else 0.65)   # int4: 0.5 + 4/32 bytes; fp32: 4


@needs["native"]
def test_int8_activations_round_x_to_int8_where_set():
    """`runtime.activations = "int8"`: the product is the dequantized weight times x rounded to int8
    per group of 32 (native.rounded(x, 8)); "int16" is back to the finer rounding."""
    torch.manual_seed(0)
    fast = NativeInt4Weight(torch.randn(48, 128) * 0.05)
    x = torch.randn(7, 128)
    deq = fast.dequantized().float()
    try:
        cpu_weights.set_activations("int8")
        assert cpu_weights.rounds_inputs_to_int8("int4") and not cpu_weights.rounds_inputs_to_int8("full")
        coarse = fast.linear(x, None)
    finally:
        cpu_weights.set_activations("int16")
    torch.testing.assert_close(coarse, native.rounded(x, 8) @ deq.t(), rtol=1e-5, atol=1e-5)
    fine = fast.linear(x, None)
    assert not cpu_weights.rounds_inputs_to_int8("int4")
    torch.testing.assert_close(fine, native.rounded(x, 16) @ deq.t(), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(coarse, fine, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="int16, int8"):
        cpu_weights.set_activations("int4")


@needs["native"]
@needs["int4"]
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_the_native_int4_kernel_multiplies_by_torchs_int4_weights(rows):
    """The same codes, scales and zeros as torch's int4 copy: the same dequantized weight (up to
    the bf16 rounding torch's kernel gives its output); ours rounds x to int16 per group of 32 and
    sums in integers, torch's rounds x to bf16 and its output to bf16; rows of x in passes of 4 and a
    remainder; bf16 inputs come back bf16; a weight whose rows are not whole blocks of 16 is not
    the C kernel's."""
    torch.manual_seed(1)
    weight = torch.randn(80, 192) * 0.05
    assert not NativeInt4Weight.fits(weight[:67]) and NativeInt4Weight.fits(weight)
    ours, torchs = NativeInt4Weight(weight[:64]), Int4Weight(weight[:64])
    assert torch.allclose(ours.dequantized(), torchs.dequantized(), rtol=2 ** -8, atol=1e-6)
    x = torch.randn(rows, 192)
    exact = native.rounded(x, 16) @ ours.dequantized().t()
    assert (ours.linear(x, None) - exact).abs().max() < 1e-4 * exact.abs().max()
    bf16 = x.bfloat16().float() @ ours.dequantized().t()
    assert (torchs.linear(x, None) - bf16).abs().max() < 1e-2 * bf16.abs().max()    # bf16 outputs
    assert (ours.linear(x, None) - bf16).abs().max() < 1e-2 * bf16.abs().max()      # int16 x: nearer exact
    odd = NativeInt4Weight(weight)
    y = odd.linear(x, torch.ones(80))
    assert torch.allclose(y - 1, native.rounded(x, 16) @ odd.dequantized().t(), rtol=1e-4, atol=1e-4)
    assert odd.linear(x.bfloat16(), None).dtype == torch.bfloat16
    batch = torch.randn(11, 192)                                      # two passes of 4 rows of x and one of 3
    assert all(torch.equal(odd.linear(batch, None)[i], odd.linear(batch[i:i + 1], None)[0]) for i in range(11))
    with pytest.raises(ValueError, match="features"):                 # the C kernel trusts its shapes: we check
        odd.linear(torch.randn(rows, 128), None)


@pytest.mark.skipif(native.int8_gemm() is None, reason="no native int8 kernel on this machine")
@pytest.mark.parametrize("rows", [1, 3, 7])
def test_the_int8_head_is_q8_0_and_multiplies_in_fp32(rows):
    """A weight on llama.cpp's Q8_0 grid (int8 codes × one fp16 scale per 32 inputs, as the embedded
    GGUF stores the tied embedding) comes back exactly, and the product is fp32's up to summation
    order (x is not rounded to bf16); any other weight is within half a code per group; each row of
    x gets the same sums alone as in a batch; an all-zero group is zero, not NaN."""
    torch.manual_seed(2)
    codes = torch.randint(-127, 128, (39, 96), dtype=torch.int8)
    codes[:, ::32] = 127                                               # each group's largest code
    scales = (torch.rand(39, 3) * 1e-3).half()
    weight = (codes.float().view(39, 3, 32) * scales.float()[..., None]).view(39, 96)
    weight[5, 32:64] = 0.0
    head = cpu_weights.fast_copy(weight, "q8")
    assert isinstance(head, cpu_weights.NativeInt8Weight) and head.nbytes == 48 * 96 + 48 * 3 * 2   # 3 blocks of 16 rows
    assert torch.equal(head.dequantized(), weight)
    x = torch.randn(rows, 96)
    exact = x.double() @ weight.double().t()
    assert (head.linear(x, None).double() - exact).abs().max() < 1e-6 * exact.abs().max()
    assert all(torch.equal(head.linear(x, None)[i], head.linear(x[i:i + 1], None)[0]) for i in range(rows))
    assert head.linear(x.bfloat16(), None).dtype == torch.bfloat16
    other = torch.randn(39, 96) * 0.05
    step = other.view(39, 3, 32).abs().amax(-1, keepdim=True) / 127
    assert ((cpu_weights.NativeInt8Weight(other).dequantized() - other).view(39, 3, 32).abs()
            <= step / 2 * (1 + 2 ** -10) + 1e-9).all()
    with pytest.raises(ValueError, match="features"):
        head.linear(torch.randn(1, 64), None)


def test_the_q8_head_falls_back_to_bf16_where_the_kernel_does_not_build(monkeypatch):
    monkeypatch.setattr(cpu_weights.NativeInt8Weight, "fits", classmethod(lambda cls, weight: False))
    head = cpu_weights.fast_copy(torch.randn(64, 64), "q8")
    assert type(head) is (OneDnnBF16 if cpu_weights.onednn_bf16_available() else type(None))


@needs["int4"]
def test_shapes_the_int4_kernel_cannot_take_stay_plain(monkeypatch):
    assert fast_copy(torch.randn(32, 48), "int4") is None                # in not a multiple of 32
    assert type(fast_copy(torch.randn(32, 96), "int4")) is Int4Weight    # the C kernel takes whole 64-input blocks
    assert isinstance(fast_copy(torch.randn(33, 48), "int8"), Int8Weight)   # int8 takes any shape
    if native.int4_gemm() is not None:                                   # ours takes blocks of 16 rows
        assert type(fast_copy(torch.randn(48, 64), "int4")) is NativeInt4Weight
        assert fast_copy(torch.randn(33, 64), "int4") is None
    monkeypatch.setattr(NativeInt4Weight, "fits", classmethod(lambda cls, weight: False))   # torch's alone
    assert fast_copy(torch.randn(33, 64), "int4") is None                # out not a multiple of 16
    assert type(fast_copy(torch.randn(32, 64), "int4")) is Int4Weight


@pytest.mark.parametrize("kind", [pytest.param(Int4Weight, marks=needs["int4"]), pytest.param(NativeInt4Weight, marks=needs["native"])])
def test_stacked_int4_copies_multiply_like_their_parts_side_by_side(kind):
    torch.manual_seed(0)
    parts = [kind(torch.randn(rows, 128) * 0.05) for rows in (128, 64, 64)]
    x = torch.randn(3, 128)
    apart = torch.cat([p.linear(x, None) for p in parts], dim=-1)
    stacked = cpu_weights.stacked(parts)
    assert torch.equal(stacked.linear(x, None), apart)
    assert stacked.nbytes >= sum(p.nbytes for p in parts)
    # The parts now read their rows of the stacked codes (no second copy) and still multiply alike.
    codes, first = ("packed", 128) if kind is Int4Weight else ("codes", 128 // native.BLOCK_ROWS)   # rows, blocks
    assert getattr(parts[1], codes).data_ptr() == getattr(stacked, codes)[first:].data_ptr()
    assert torch.equal(torch.cat([p.linear(x, None) for p in parts], dim=-1), apart)
    assert cpu_weights.stacked(parts) is stacked                                                         # made once
    assert cpu_weights.stacked([Int8Weight(torch.randn(64, 128))] * 2) is None                           # int4 only
    if kind is Int4Weight:
        assert cpu_weights.stacked([kind(torch.randn(48, 128)), kind(torch.randn(64, 128))]) is None    # part of a 64-row block
    else:
        odd = [kind(torch.randn(rows, 128)) for rows in (48, 32)]                          # whole 16-row blocks
        assert torch.equal(torch.cat([p.linear(x, None) for p in odd], -1), cpu_weights.stacked(odd).linear(x, None))


@needs["native"]
@pytest.mark.parametrize("pages", ["huge", "none"])
def test_settle_stacks_the_groups_and_moves_the_copies_without_changing_a_product(monkeypatch, pages):
    """q/k/v and gate/up come out stacked (what lean_llama asks for), every C-kernel copy in one
    2 MB-aligned block where the OS takes the advice (else where they were), products unchanged."""
    torch.manual_seed(3)
    shapes = {"l.q_proj": (128, 64), "l.k_proj": (64, 64), "l.v_proj": (64, 64), "l.o_proj": (64, 128),
              "l.gate_proj": (192, 64), "l.up_proj": (192, 64), "lm_head": (96, 64)}
    copies = {name: (cpu_weights.NativeInt8Weight if name == "lm_head" else NativeInt4Weight)(torch.randn(shape) * 0.05)
              for name, shape in shapes.items()}
    inputs = {name: torch.randn(3, shape[1]) for name, shape in shapes.items()}
    before = {name: copy.linear(inputs[name], None) for name, copy in copies.items()}
    if pages == "none":
        monkeypatch.setattr(cpu_weights, "_huge_pages", lambda nbytes: None)
    cpu_weights.settle(copies)
    assert all(torch.equal(copy.linear(inputs[name], None), before[name]) for name, copy in copies.items())
    qkv = cpu_weights.stacked([copies["l.q_proj"], copies["l.k_proj"], copies["l.v_proj"]])   # made by settle
    assert qkv is copies["l.q_proj"]._stacked[1]
    assert copies["l.k_proj"].codes.data_ptr() == qkv.codes[128 // native.BLOCK_ROWS:].data_ptr()   # blocks of rows
    assert torch.equal(qkv.linear(inputs["l.q_proj"], None),
                       torch.cat([copies[n].linear(inputs["l.q_proj"], None) for n in ("l.q_proj", "l.k_proj", "l.v_proj")], -1))
    blocks = {copy.codes.untyped_storage().data_ptr() for copy in copies.values()}
    if pages == "huge" and cpu_weights._huge_pages(1) is not None:
        assert len(blocks) == 1 and qkv.codes.data_ptr() % (2 << 20) == 0
    else:
        assert len(blocks) > 1
    pointers = {name: copy.codes.data_ptr() for name, copy in copies.items()}
    cpu_weights.settle(copies)                                            # settled already: nothing moves
    assert {name: copy.codes.data_ptr() for name, copy in copies.items()} == pointers


@pytest.mark.parametrize("dtype, weights, kind, tolerance", [
    pytest.param(torch.float32, "int4", INT4, 0.1, marks=needs["int4"]),
    pytest.param(torch.bfloat16, "full", OneDnnBF16, 0.03,
                 marks=pytest.mark.skipif(not cpu_weights.onednn_bf16_available(), reason="no oneDNN bf16")),
])
def test_a_hot_bitdelta_is_densified_in_the_bases_format_and_charged_as_such(tiny_base_dir, dtype, weights, kind,
                                                                             tolerance):
    from zenedge.bitdelta.packing import pack_signs
    from zenedge.runtime.variants import BitDeltaModule, Variant

    resident = load_resident("tiny", tiny_base_dir, CPU, dtype, weights=weights)
    torch.manual_seed(0)
    modules = {}
    for name in resident.state.modules:
        weight = resident.model.get_submodule(name).base.weight
        modules[name] = BitDeltaModule(pack_signs(torch.randn(weight.shape)), torch.full((weight.shape[0],), 0.01),
                                       weight.shape[1])
    variant = Variant("d", "bitdelta", modules)
    expected = dense_nbytes(variant, resident.model)
    assert expected == sum(resident.model.get_submodule(n).fast.nbytes for n in modules)
    ids = torch.randint(3, 99, (2, 7))
    with torch.inference_mode(), resident.state.using([variant, variant]):
        packed_path = resident.model(input_ids=ids).logits.float()   # the base's copy + the exact 1-bit delta
    densify(variant, resident.model)
    assert all(isinstance(m.dense, kind) for m in modules.values())
    assert sum(m.dense.nbytes for m in modules.values()) == expected
    with torch.inference_mode(), resident.state.using([variant, variant]):
        dense_path = resident.model(input_ids=ids).logits.float()    # (W + α⊙S) in the base's format
    assert (dense_path - packed_path).abs().max() < tolerance * packed_path.abs().max()


def test_weights_setting_is_checked():
    from zenedge.errors import Unavailable
    from zenedge.runtime.device import pick_weights

    assert pick_weights("auto", torch.device("cuda")) == "full"
    assert pick_weights("auto", CPU) == ("int4" if cpu_weights.quantized_kernels_available("int4") else "full")
    with pytest.raises(Unavailable, match="CPU format"):
        pick_weights("int4", torch.device("cuda"))
    assert pick_weights("full", CPU) == "full"


@needs["int4"]
def test_the_cpu_default_serves_int4_and_its_loops_agree(store, tmp_path, lora_factory):
    """No `runtime.weights` in the config: on CPU the engine serves int4 copies; the static loop
    (lean forward) gives the reference loop's tokens on them, for a mixed LoRA/base batch."""
    from zenedge import config, pool
    from zenedge.runtime.engine import Engine
    from zenedge.runtime.generate import GenerationRequest, SamplingParams, generate

    path = tmp_path / "config" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('[runtime]\ndevice = "cpu"\n')
    cfg = config.load(path)
    pool.import_lora(store, cfg, lora_factory(seed=5), "ada", base="tiny")
    engine = Engine(store, cfg)
    route = engine.router.route("ada")
    resident = engine.resident(route.base)
    assert resident.weights == "int4" and engine.ps()["weights"] == "int4"
    lora = engine.variant(route)
    requests = [GenerationRequest([5, 9, 14, 3, 22], lora, SamplingParams(max_tokens=12)),
                GenerationRequest([7, 8], None, SamplingParams(max_tokens=12))]

    def tokens(stepper):
        out = [[], []]
        for deltas in generate(resident, requests, stepper=stepper):
            for d in deltas:
                out[d.index].append(d.token_id)
        return out

    assert tokens("static") == tokens("dynamic")


@needs["int4"]
def test_an_int4_resident_holds_no_plain_linears_and_prefills_from_the_int4_copies(tiny_base_dir, monkeypatch):
    from zenedge.runtime.generate import GenerationRequest, SamplingParams, generate
    from zenedge.runtime.layers import VariantLinear

    from zenedge.runtime import c_step

    resident = load_resident("tiny", tiny_base_dir, CPU, torch.float32, weights="int4")
    linears = [m for m in resident.model.modules() if isinstance(m, VariantLinear)]
    assert linears and all(not m.keeps_plain and m.fast is not None for m in linears)
    assert all(m.base.weight.device.type == "meta" for m in linears)      # shape only, no bytes
    # The Python decode step: the C one (test_decode_step.py) calls the same kernel out of this spy's sight.
    monkeypatch.setattr(c_step.FusedStep, "build", classmethod(lambda cls, *args: None))
    rows_seen = []
    kind = type(resident.model.model.layers[0].mlp.down_proj.fast)
    original = kind._matmul
    monkeypatch.setattr(kind, "_matmul", lambda self, flat: rows_seen.append(flat.shape[0]) or original(self, flat))
    requests = [GenerationRequest(list(range(3, 43)), None, SamplingParams(max_tokens=4))]
    for _ in generate(resident, requests, stepper="static"):
        pass
    assert set(rows_seen) == {40, 1}     # the prompt's 40 tokens in one product, then one row a step


@needs["int4"]
def test_asking_for_plain_weights_reads_the_int4_weights_and_the_exact_tied_head(tiny_base_dir):
    """What the quality gate's scoring and a prefill ask for: the weights the resident holds.
    For an int4 resident those are its int4 linears (the plain fp32 ones are not kept) and the
    exact tied embedding as the head, not its Q8_0 copy."""
    from zenedge.runtime.layers import VariantLinear

    full = load_resident("tiny", tiny_base_dir, CPU, torch.float32)
    int4 = load_resident("tiny", tiny_base_dir, CPU, torch.float32, weights="int4")
    for name, module in int4.model.named_modules():
        if isinstance(module, VariantLinear):        # the fp32 model, given the int4 weights' values
            full.model.get_submodule(name).base.weight.copy_(module.fast.dequantized())
    ids = torch.randint(3, 99, (2, 12))
    with torch.inference_mode():
        dequantized = full.model(input_ids=ids).logits
        with int4.state.using([None, None], plain=True):
            plain = int4.model(input_ids=ids).logits
        quantized = int4.model(input_ids=ids).logits
    # (the int4 kernel rounds x to int16 per group of 32: close to, not bit for bit, fp32)
    assert torch.allclose(plain, dequantized, atol=2e-3, rtol=0)
    assert not torch.equal(quantized, plain)                 # the Q8_0 head outside `plain`


@needs["native"]
def test_an_untied_head_is_quantized_as_it_is_read_to_the_same_copy(tmp_path):
    """The quantizing load makes an untied head's Q8_0 copy from the checkpoint's tensor as it
    reads it (never a widened parameter): the same codes and scales as from the fp32 weight."""
    from tests.conftest import make_tiny_base

    base = make_tiny_base(tmp_path / "untied", tied=False)
    int4 = load_resident("tiny", base, CPU, torch.float32, weights="int4")
    full = load_resident("tiny", base, CPU, torch.float32)
    head = int4.model.lm_head
    assert not head.keeps_plain and head.weight.device.type == "meta"
    reference = cpu_weights.fast_copy(full.model.lm_head.weight, "q8")
    assert torch.equal(head.fast.codes, reference.codes) and torch.equal(head.fast.scale, reference.scale)


@needs["native"]
def test_the_q8_copy_is_the_same_made_in_row_chunks(monkeypatch):
    weight = torch.randn(100, 64) * torch.rand(100, 1) * 3
    weight[7, :32] = 0                                   # an all-zero group
    whole = cpu_weights.NativeInt8Weight(weight)
    monkeypatch.setattr(cpu_weights.NativeInt8Weight, "CHUNK_ROWS", 16)
    chunked = cpu_weights.NativeInt8Weight(weight.to(torch.bfloat16).float())
    again = cpu_weights.NativeInt8Weight(weight)
    assert torch.equal(whole.codes, again.codes) and torch.equal(whole.scale, again.scale)
    assert torch.equal(chunked.dequantized(), cpu_weights.NativeInt8Weight(weight.to(torch.bfloat16)).dequantized())
