"""The lean Llama forward (lean_llama.py) against transformers' forward through the same static
cache: the same logits (fp32, 1e-5) over chunked prefills and decode steps, for plain, LoRA,
BitDelta and mixed batches of rows of different lengths, across the Llama variations it accepts;
the same greedy tokens as the DynamicStepper reference; and the transformers path for what it
refuses."""

import pytest
import torch

from tests.conftest import tiny_tokenizer
from zenedge.bitdelta.packing import pack_signs
from zenedge.merge.factors import LoraFactors
from zenedge.kernels import native
from zenedge.runtime import c_step, cpu_weights, decode, layers, lean_llama
from zenedge.runtime.dense_bitdelta import densify, undensify
from zenedge.runtime.generate import GenerationRequest, SamplingParams, generate
from zenedge.runtime.layers import RowVariants
from zenedge.runtime.transforms import convert_model, patch_model
from zenedge.runtime.model import ResidentModel
from zenedge.runtime.variants import BitDeltaModule, Variant

CPU = torch.device("cpu")
STEPS = 16
# Weights large enough that attention is far from uniform: a wrong rope, mask or head grouping
# moves the logits by far more than the tolerance.
SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, initializer_range=0.15,
             tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls gain nothing from threads, and on a loaded machine their synchronisation
    turns milliseconds into seconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_resident(architecture: str = "llama", attention: str = "sdpa", **overrides) -> ResidentModel:
    import transformers

    config_class, model_class = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[architecture]
    torch.manual_seed(0)
    config = config_class(**{**SMALL, **overrides})
    config._attn_implementation = attention
    model = model_class(config).eval().requires_grad_(False)
    state = patch_model(model, CPU)
    return ResidentModel("tiny", model, tiny_tokenizer(), state, CPU, torch.float32, 0.0, (2,))


def lora(resident: ResidentModel, seed: int) -> Variant:
    g = torch.Generator().manual_seed(seed)
    modules = {}
    for name in resident.target_modules:
        out_f, in_f = resident.model.get_submodule(name).weight.shape
        modules[name] = LoraFactors(torch.randn(4, in_f, generator=g) * 0.2, torch.randn(out_f, 4, generator=g) * 0.2, 2.0)
    return Variant(f"lora-{seed}", "lora", modules)


def bitdelta(resident: ResidentModel, seed: int) -> Variant:
    g = torch.Generator().manual_seed(seed)
    modules = {}
    for name in resident.target_modules:
        out_f, in_f = resident.model.get_submodule(name).weight.shape
        modules[name] = BitDeltaModule(pack_signs(torch.randn(out_f, in_f, generator=g)),
                                       torch.full((out_f,), 0.02), in_f)
    return Variant(f"delta-{seed}", "bitdelta", modules)


def step_logits(resident, rows, prompts, *, lean: bool, fixed: bool = False, chunk: int = 3) -> torch.Tensor:
    """Logits [1 + STEPS, B, V]: each row's prompt prefilled alone in chunks of `chunk` tokens (the
    last one's logits), then STEPS decode steps of every row fed fixed pseudo-random tokens (the
    same for both paths, whatever they predict)."""
    lean_llama.set_enabled(resident.model, lean)
    batch = RowVariants.build(rows, CPU)
    feed = torch.randint(3, SMALL["vocab_size"], (STEPS, len(prompts)), generator=torch.Generator().manual_seed(1))
    width = max(len(prompt) for prompt in prompts)
    with resident.kv_pool.acquire(len(rows), width + STEPS, full_views=fixed) as cache:
        stepper = (decode.FixedShapeStepper if fixed else decode.StaticStepper)(resident, batch, cache)
        assert (stepper.forward.lean is not None) == lean
        first = [[stepper.prefill(row, prompt[i:i + chunk]) for i in range(0, len(prompt), chunk)][-1]
                 for row, prompt in enumerate(prompts)]
        out = [torch.stack(first)]
        out += [stepper.step(ids.tolist(), [True] * len(rows)) for ids in feed]
    return torch.stack(out)


def assert_same_logits(resident, rows, prompts, fixed: bool = False):
    ours = step_logits(resident, rows, prompts, lean=True, fixed=fixed)
    reference = step_logits(resident, rows, prompts, lean=False, fixed=fixed)
    assert ours.shape == (1 + STEPS, len(rows), SMALL["vocab_size"])
    assert reference.abs().max() > 1.0                   # logits of a size where differences would show
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=0)


MIXED_PROMPTS = [[5, 9, 17, 33, 4, 8, 21], [40, 41], [7, 60, 61, 62, 63]]


@pytest.mark.parametrize("rows", ["base", "lora", "bitdelta"])
def test_one_variant_matches_transformers(rows):
    resident = tiny_resident()
    variant = {"base": None, "lora": lora(resident, 1), "bitdelta": bitdelta(resident, 2)}[rows]
    assert_same_logits(resident, [variant, variant], [[5, 9, 17, 33], [40, 41, 42, 43]])


@pytest.mark.parametrize("architecture, overrides", [
    ("llama", {}),                                                    # GQA, tied
    ("llama", {"num_key_value_heads": 4}),                            # MHA
    ("llama", {"attention_bias": True, "mlp_bias": True}),
    ("llama", {"tie_word_embeddings": False}),
    ("llama", {"rope_parameters": LLAMA3_ROPE, "num_key_value_heads": 1}),
    ("llama", {"attention": "eager", "hidden_act": "gelu_pytorch_tanh"}),    # not SiLU: the module is called
    ("mistral", {"sliding_window": None}),
    ("qwen2", {"use_sliding_window": False}),
], ids=["gqa", "mha", "bias", "untied", "llama3-rope-mqa", "eager-gelu", "mistral", "qwen2"])
def test_a_mixed_batch_of_rows_of_different_lengths_matches_transformers(architecture, overrides):
    resident = tiny_resident(architecture, **overrides)
    assert lean_llama.supported(resident.model), lean_llama.unsupported_reason(resident.model)
    assert_same_logits(resident, [None, lora(resident, 1), bitdelta(resident, 2)], MIXED_PROMPTS)


def test_full_views_mode_matches_transformers():
    resident = tiny_resident()
    assert_same_logits(resident, [bitdelta(resident, 2), None, lora(resident, 1)], MIXED_PROMPTS, fixed=True)


def test_greedy_generation_gives_the_reference_tokens():
    resident = tiny_resident()
    variants = [None, lora(resident, 1), bitdelta(resident, 2)]
    requests = [GenerationRequest(ids, v, SamplingParams(max_tokens=20)) for ids, v in zip(MIXED_PROMPTS, variants)]

    def tokens(stepper):
        return [[d.token_id for d in deltas] for deltas in generate(resident, requests, stepper=stepper)]

    with decode.open_stepper(resident, RowVariants.build(variants, CPU), 8, 20) as stepper:
        assert stepper.forward.lean is not None                       # "auto" takes the lean path
    ours = tokens("auto")
    assert len(ours) >= 16 and ours == tokens("dynamic")
    assert tokens("fixed") == ours


def test_refused_models_keep_the_transformers_path():
    qwen3 = tiny_resident("qwen3")                                    # q/k norms: not Llama's math
    assert not lean_llama.supported(qwen3.model)
    assert_refused_but_served(qwen3)

    llama = tiny_resident()
    llama.model.model.layers[1].mlp.register_forward_hook(lambda *args: None)   # a hook we would skip
    assert "hooks" in lean_llama.unsupported_reason(llama.model)
    assert_refused_but_served(llama)

    llama = tiny_resident()
    llama.model.config._attn_implementation = "flex_attention"
    assert not lean_llama.supported(llama.model)


def assert_refused_but_served(resident):
    batch = RowVariants.build([None], CPU)
    with decode.open_stepper(resident, batch, 4, 4, "static") as stepper:
        assert stepper.forward.lean is None
        logits = stepper.prefill(0, [5, 6, 7, 8])
        assert logits.shape == (SMALL["vocab_size"],) and torch.isfinite(logits).all()


@pytest.fixture(params=["native", "torch"])
def int4_kernel(request, monkeypatch):
    """Which int4 kernel the copies use: zenedge's C kernel (where it builds) or torch's."""
    if request.param == "native" and native.int4_gemm() is None:
        pytest.skip("no native int4 kernel on this machine")
    if request.param == "torch":
        monkeypatch.setattr(cpu_weights.NativeInt4Weight, "fits", classmethod(lambda cls, weight: False))
    return request.param


@pytest.mark.skipif(not cpu_weights.quantized_kernels_available("int4"), reason="no int4 CPU kernel")
@pytest.mark.parametrize("rows, bias", [("base", False), ("lora", False), ("bitdelta", False), ("hot-bitdelta", False),
                                        ("mixed", False), ("base", True), ("lora", True), ("hot-bitdelta", True)])
def test_bound_decode_linears_give_the_modules_logits_exactly(rows, bias, int4_kernel, monkeypatch):
    """On int4 copies a decode step calls the kernels directly, q/k/v and gate/up as one stacked
    product each (a hot BitDelta's dense copies too; biases stacked too), LoRA products added on
    the slices, o and down added to the residual in the kernel's dtype: bit for bit what the
    modules compute."""
    resident = tiny_resident(hidden_size=128, intermediate_size=128, num_key_value_heads=2,   # k/v: 64 rows
                             attention_bias=bias, mlp_bias=bias)
    if bias:   # transformers initialises biases to zero: make them count
        for layer in resident.model.model.layers:
            for linear in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.mlp.up_proj):
                linear.base.bias.normal_(0, 0.5)
    convert_model(resident.model, "int4")
    variants = {"base": [None, None], "lora": [lora(resident, 1)] * 2, "bitdelta": [bitdelta(resident, 2)] * 2,
                "hot-bitdelta": [bitdelta(resident, 2)] * 2, "mixed": [lora(resident, 1), None]}[rows]
    if rows == "hot-bitdelta":
        densify(variants[0], resident.model)
    prompts = [[5, 9, 17, 33], [40, 41, 42, 43]]
    bound = step_logits(resident, variants, prompts, lean=True)
    attention = resident.model.model.layers[0].self_attn
    first = attention.q_proj.step_delta(RowVariants.build(variants, CPU))
    first = first.dense if isinstance(first, BitDeltaModule) else attention.q_proj.fast
    stacked = getattr(first, "_stacked", (None, None))[1]
    # the base's C-kernel copies are stacked at conversion (cpu_weights.settle), used or not
    settled = first is attention.q_proj.fast and type(first) is cpu_weights.NativeInt4Weight
    assert (stacked is not None) == (rows in ("base", "lora", "hot-bitdelta") or settled)   # else one by one
    with monkeypatch.context() as m:                                  # every linear called as a module
        m.setattr(c_step.FusedStep, "build", classmethod(lambda cls, *args: None))   # (`bound`: the C step)
        m.setattr(lean_llama, "bound", lambda linear, batch, cast=True: linear)
        m.setattr(lean_llama, "products", lambda linears, batch: layers.each(*linears))
        modules = step_logits(resident, variants, prompts, lean=True)
    assert torch.equal(bound, modules)
    # Against transformers' forward over the same int4 copies: torch's kernel rounds its inputs to
    # bf16, so the lean path's own norm and attention (C kernels, other summation orders) flip a
    # few roundings; a wrong rope, mask or slice moves logits by far more.
    torch.testing.assert_close(bound, step_logits(resident, variants, prompts, lean=False), atol=0.1, rtol=0.01)


@pytest.mark.skipif(not cpu_weights.quantized_kernels_available("int4"), reason="no int4 CPU kernel")
def test_a_bound_bitdelta_linear_follows_its_dense_copy_mid_request(int4_kernel):
    """The delta cache may densify a variant, or drop its dense copy, while a request decodes: the
    bound step reads the module's state per call, as the module does."""
    resident = tiny_resident(hidden_size=128, intermediate_size=128, num_key_value_heads=2)
    convert_model(resident.model, "int4")
    variant = bitdelta(resident, 2)
    linear = resident.model.model.layers[0].mlp.down_proj
    batch = RowVariants.build([variant], CPU)
    step = layers.bound(linear, batch)
    x = torch.randn(1, linear.base.in_features)
    with torch.inference_mode(), resident.state.applied(batch):
        cold = step(x)
        assert torch.equal(cold, linear(x))
        densify(variant, resident.model)
        hot = step(x)
        assert torch.equal(hot, linear(x)) and not torch.equal(hot, cold)
        undensify(variant)
        assert torch.equal(step(x), cold)
    # q/k/v bound while hot read one stacked copy of the dense weights; it serves only while the
    # variant still holds those copies.
    attention = resident.model.model.layers[0].self_attn
    projections = (attention.q_proj, attention.k_proj, attention.v_proj)
    densify(variant, resident.model)
    qkv = layers.products(projections, batch)
    x = torch.randn(1, attention.q_proj.base.in_features)
    with torch.inference_mode(), resident.state.applied(batch):
        def modules():
            return torch.cat([linear(x) for linear in projections], -1)
        hot = qkv(x)
        assert torch.equal(hot, modules())
        assert getattr(variant.modules[attention.q_proj.name].dense, "_stacked", None) is not None
        undensify(variant)
        assert torch.equal(qkv(x), modules()) and not torch.equal(qkv(x), hot)
        densify(variant, resident.model)                               # new dense copies, not the stacked ones
        assert torch.equal(qkv(x), hot)
