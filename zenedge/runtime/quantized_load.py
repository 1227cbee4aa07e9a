"""Load a base straight into its quantized resident form, one tensor at a time.

`from_pretrained` materialises every weight in the model's dtype before zenedge quantizes it:
a 1.7B base took 9 GiB resident (its fp32 linears kept beside the int4 copies) and an 8B base
could not load on a laptop at all. Here the model is built with its parameters on the meta
device (buffers, such as the rotary tables, are computed as usual), then each tensor of the
checkpoint is read from its file on its own: a decoder linear's weight becomes its int4/int8
copy (cpu_weights.fast_copy) and is dropped, every other tensor (embeddings, norms) becomes the
parameter. Peak memory is the quantized model plus one fp32 weight, not the fp32 model.

A quantized linear keeps its weight on the meta device (shape and dtype, no bytes): whatever
needs its numbers reads the copy (`layers.plain_weight`: the dequantized weight the kernels
multiply by). A checkpoint whose tensors do not name the model's parameters one to one (an
architecture transformers renames keys for) returns None: the caller loads it the usual way.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from zenedge.runtime import cpu_weights
from zenedge.runtime.layers import VariantLinear, VariantState
from zenedge.runtime.transforms import patch_model

# Formats whose copy replaces the plain weight (a lossy copy: the resident keeps no other).
QUANTIZED = ("int4", "int8")


@contextmanager
def _parameters_on_meta():
    """Every parameter registered meanwhile lands on the meta device (its init, if any, runs on
    a tensor that is freed at once); buffers stay real."""
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def load_quantized(directory: Path, dtype: torch.dtype, fmt: str,
                   progress=None) -> tuple[nn.Module, VariantState] | None:
    """The base in `directory` with its decoder linears in `fmt` ("int4" / "int8") and no plain
    copy of them, patched for variants (transforms.patch_model); None where the checkpoint does
    not map onto the model tensor by tensor. `progress(done, total)` after each tensor."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(directory)
    with _parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval().requires_grad_(False)
    state = patch_model(model, torch.device("cpu"))
    owners = _owners(model)
    files = sorted(Path(directory).glob("*.safetensors"))
    keys = {}
    for path in files:
        with safe_open(path, framework="pt") as f:
            keys.update((key, path) for key in f.keys())
    if not files or any(key not in owners for key in keys):
        return None
    done = 0
    for path in files:
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                module, attr, variant = owners[key]
                _place(module, attr, variant, f.get_tensor(key).to(dtype), fmt)
                done += 1
                if progress is not None:
                    progress(done, len(keys))
    if getattr(config, "tie_word_embeddings", False) or getattr(config.get_text_config(), "tie_word_embeddings", False):
        model.tie_weights()
    quantized = {id(v.base.weight) for v in model.modules() if isinstance(v, VariantLinear) and v.fast is not None}
    if any(p.device.type == "meta" and id(p) not in quantized for p in model.parameters()):
        return None                                        # a tensor the checkpoint does not hold
    try:
        model.generation_config = GenerationConfig.from_pretrained(directory)
    except OSError:                                        # no generation_config.json: the model's defaults
        pass
    return model, state


def _owners(model: nn.Module) -> dict[str, tuple[nn.Module, str, VariantLinear | None]]:
    """Checkpoint key → (module holding it, attribute, the VariantLinear wrapping that module or
    None). The key names the original linear (`…q_proj.weight`); the tree has `…q_proj.base`."""
    variants = {name: m for name, m in model.named_modules() if isinstance(m, VariantLinear)}
    owners = {}
    for name, module in model.named_modules():
        if isinstance(module, VariantLinear):
            continue
        variant = variants.get(name.removesuffix(".base")) if name.endswith(".base") else None
        prefix = name.removesuffix(".base") if variant is not None else name
        for attr, _ in module.named_parameters(recurse=False):
            owners[f"{prefix}.{attr}" if prefix else attr] = (module, attr, variant)
    return owners


def _place(module: nn.Module, attr: str, variant: VariantLinear | None, tensor: torch.Tensor, fmt: str) -> None:
    if attr == "weight" and variant is not None:
        fast = cpu_weights.fast_copy(tensor, fmt)
        if fast is not None:            # the copy is the weight now; the parameter keeps its shape only
            variant.fast = fast
            return
    setattr(module, attr, nn.Parameter(tensor, requires_grad=False))
