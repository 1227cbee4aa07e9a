"""The model transforms (transforms.py): patch_model swaps only the decoder layers' target
linears, and convert_model gives them and the output head fast CPU copies, keeping a tied head
tied and LoRA rows exact on top of an int4 base."""

import json

import pytest
import torch
from torch import nn

from zenedge.kernels import native
from zenedge.runtime import cpu_weights
from zenedge.runtime.cpu_weights import Int4Weight, NativeInt4Weight
from zenedge.runtime.layers import VariantLinear
from zenedge.runtime.model import load_resident
from zenedge.runtime.transforms import DEFAULT_TARGETS, patch_model

CPU = torch.device("cpu")
needs = {"int4": pytest.mark.skipif(not cpu_weights.quantized_kernels_available("int4"), reason="no int4 CPU kernel")}
INT4 = (Int4Weight, NativeInt4Weight)


def test_patch_model_swaps_the_decoder_layers_target_linears_only(tiny_base_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_base_dir).eval()
    head = model.lm_head
    state = patch_model(model, CPU)
    swapped = {name for name, m in model.named_modules() if isinstance(m, VariantLinear)}
    assert swapped == set(state.modules) and swapped
    assert all(".layers." in name and name.rsplit(".", 1)[-1] in DEFAULT_TARGETS for name in swapped)
    assert model.lm_head is head and type(head) is nn.Linear                # the head is not a target
    assert all(m.state is state for m in model.modules() if isinstance(m, VariantLinear))


@needs["int4"]
def test_an_int4_resident_is_close_to_fp32_and_adds_lora_rows_exactly(tiny_base_dir, lora_factory):
    from zenedge.runtime.variants import load_lora

    full = load_resident("tiny", tiny_base_dir, CPU, torch.float32)
    int4 = load_resident("tiny", tiny_base_dir, CPU, torch.float32, weights="int4")
    linears = [m for m in int4.model.modules() if isinstance(m, VariantLinear)]
    assert linears and all(isinstance(m.fast, INT4) for m in linears)
    if native.int8_gemm() is not None:            # the head in Q8_0 (groups of 32), through the C kernel
        assert isinstance(int4.model.lm_head.fast, cpu_weights.NativeInt8Weight)
    elif cpu_weights.onednn_bf16_available():    # else bf16: its rounding lands in the logits
        assert isinstance(int4.model.lm_head.fast, cpu_weights.OneDnnBF16)
    else:                                         # neither (native kernels off, a CPU without bf16): fp32
        assert type(int4.model.lm_head) is nn.Linear
    assert int4.model.lm_head.weight is int4.model.model.embed_tokens.weight      # still tied
    assert all(m.fast is None for m in full.model.modules() if isinstance(m, VariantLinear))

    ids = torch.randint(3, 99, (3, 10))
    with torch.inference_mode():
        exact = full.model(input_ids=ids).logits
        quant = int4.model(input_ids=ids).logits
    assert 0 < (quant - exact).abs().max() < 0.1 * exact.abs().max()

    adapter = lora_factory(seed=3)
    config = json.loads((adapter / "adapter_config.json").read_text())
    lora = load_lora("l", "lora", adapter / "adapter_model.safetensors", config, CPU, torch.float32)
    # The LoRA path runs in full precision beside the quantized base: a row's variant adds the
    # same delta to the int4 model as to the fp32 one (layer 0's q_proj, where inputs agree).
    name = next(n for n in lora.modules if "layers.0.self_attn.q_proj" in n)
    x = torch.randn(2, 4, 64)
    for resident in (full, int4):
        module = resident.model.get_submodule(name)
        with torch.inference_mode():
            base = module(x)
            with resident.state.using([lora, lora]):
                delta = module(x) - base
        if resident is full:
            want = delta
    assert torch.allclose(delta, want, atol=1e-5)
