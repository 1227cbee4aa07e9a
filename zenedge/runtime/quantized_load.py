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
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from zenedge.adapters.safetensors_file import read_header
from zenedge import gguf_file
from zenedge.errors import InvalidAdapter
from zenedge.runtime import cpu_weights, resident_file
from zenedge.runtime.layers import VariantLinear, VariantState
from zenedge.runtime.transforms import HEAD_FORMATS, patch_model

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


@dataclass
class QuantizedBase:
    model: nn.Module
    state: VariantState
    copies: dict          # {module name: copy} made for modules outside the VariantLinears (the head), or read
    from_file: bool       # whether it came from its resident file (else it was quantized now)


def load_quantized(directory: Path, dtype: torch.dtype, fmt: str, reading: resident_file.Reading | None = None,
                   progress=None) -> QuantizedBase | None:
    """The base in `directory` with its decoder linears in `fmt` ("int4" / "int8") and no plain
    copy of them, patched for variants (transforms.patch_model): from its resident file where
    `reading` (resident_file.start_reading) read a valid one, else quantized from the checkpoint
    tensor by tensor. None
    where the checkpoint does not map onto the model one to one. `progress(done, total)` after
    each source tensor."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(directory)
    with _parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval().requires_grad_(False)
    state = patch_model(model, torch.device("cpu"))
    copies = resident_file.load(model, reading)
    from_file = copies is not None
    if not from_file:
        tied = getattr(config, "tie_word_embeddings", False) or getattr(config.get_text_config(), "tie_word_embeddings", False)
        copies = _quantize_from(Path(directory), model, dtype, fmt, progress, quantize_head=not tied)
        if copies is None:
            return None
    if getattr(config, "tie_word_embeddings", False) or getattr(config.get_text_config(), "tie_word_embeddings", False):
        model.tie_weights()
    quantized = {id(v.base.weight) for v in model.modules() if isinstance(v, VariantLinear) and v.fast is not None}
    quantized |= {id(model.get_submodule(name).weight) for name in copies}
    if any(p.device.type == "meta" and id(p) not in quantized for p in model.parameters()):
        return None                                        # a tensor the checkpoint does not hold
    try:
        model.generation_config = GenerationConfig.from_pretrained(directory)
    except OSError:                                        # no generation_config.json: the model's defaults
        pass
    return QuantizedBase(model, state, copies, from_file)


def _quantize_from(directory: Path, model: nn.Module, dtype: torch.dtype, fmt: str, progress,
                   quantize_head: bool) -> dict | None:
    """Fill the meta model from the checkpoint's tensors, one at a time; None where a key names
    no parameter of the model (the model is then of no use). `quantize_head` (an untied head):
    its copy is made as it is read, from the checkpoint's own dtype, and returned as {name: copy};
    it never stays as a parameter widened to the model's dtype (an 8B head: 0.8 GB)."""
    owners = _owners(model)
    if (directory / gguf_file.FILENAME).is_file():
        return _fill_from_gguf(directory / gguf_file.FILENAME, model, owners, dtype, fmt, progress, quantize_head)
    files = sorted(directory.glob("*.safetensors"))
    try:
        tables = {path: read_header(path).tensors for path in files}
        if any(info.dtype not in resident_file.READABLE for table in tables.values() for info in table.values()):
            return None
    except InvalidAdapter:
        return None                         # a header this reader does not take: from_pretrained's turn
    total = sum(len(table) for table in tables.values())
    if not files or any(key not in owners for table in tables.values() for key in table):
        return None
    head = model.get_output_embeddings() if quantize_head else None
    head_name = next((name for name, m in model.named_modules() if m is head), None) if type(head) is nn.Linear else None
    copies, done = {}, 0
    for path, table in tables.items():
        # read, not mapped: a shard's mapped pages would stay in RSS while it is open (8B: +1 GiB)
        with open(path, "rb") as f:
            for key, entry in table.items():
                module, attr, variant = owners[key]
                tensor = resident_file.read_tensor(f, entry)
                fast = cpu_weights.fast_copy(tensor, HEAD_FORMATS.get(fmt, fmt)) if key == f"{head_name}.weight" else None
                if fast is not None:
                    copies[head_name] = fast
                else:
                    _place(module, attr, variant, tensor.to(dtype), fmt)
                del tensor
                cpu_weights.release_freed_memory()      # the widened weight's pages
                done += 1
                if progress is not None:
                    progress(done, total)
    return copies


def _fill_from_gguf(path: Path, model: nn.Module, owners: dict, dtype: torch.dtype, fmt: str, progress,
                    quantize_head: bool) -> dict | None:
    """`_quantize_from` for a GGUF checkpoint: an int4 (Q4_0, Q4_1, Q4_K) or Q8_0 linear becomes a
    copy holding the file's own codes and scales (gguf_file.py), exact; any other tensor is
    dequantized and placed as a safetensors one is (a linear requantized: `fmt`'s copy, or the
    head's format)."""
    gguf = gguf_file.reader(path)
    names = gguf_file.parameter_names(gguf, owners)
    if names is None:
        return None
    config = model.config.get_text_config()
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head = model.get_output_embeddings() if quantize_head else None
    head_name = next((name for name, m in model.named_modules() if m is head), None) if type(head) is nn.Linear else None
    copies, tensors = {}, [t for t in gguf.tensors if t.name in names]
    for done, tensor in enumerate(tensors, 1):
        key = names[tensor.name]
        module, attr, variant = owners[key]
        is_head = key == f"{head_name}.weight"
        rows = gguf_file.shape(tensor)[0]
        order = gguf_file.row_order(gguf, key, rows, heads, kv_heads)
        copy = _kept_copy(tensor, order) if attr == "weight" and (variant is not None or is_head) and fmt == "int4" else None
        if copy is not None and is_head:
            copies[head_name] = copy
        elif copy is not None:
            variant.fast = copy
        else:
            weight = gguf_file.dequantized(tensor)
            weight = weight[order] if order is not None else weight
            fast = cpu_weights.fast_copy(weight, HEAD_FORMATS.get(fmt, fmt)) if is_head else None
            if fast is not None:
                copies[head_name] = fast
            else:
                _place(module, attr, variant, weight.to(dtype),
                       gguf_file.REQUANTIZED if fmt == "int4" and variant is not None else fmt)
            del weight
        cpu_weights.release_freed_memory()
        if progress is not None:
            progress(done, len(tensors))
    return copies


def _kept_copy(tensor, order: torch.Tensor | None) -> cpu_weights.CpuWeight | None:
    """The C kernels' copy of a GGUF tensor holding its own codes and scales, rows in the model's
    order; None where its type or shape has no such copy."""
    rows, inputs = gguf_file.shape(tensor)
    int4 = gguf_file.int4_blocks(tensor) if cpu_weights.NativeInt4Weight.fits_shape(rows, inputs) else None
    if int4 is not None:
        parts = [t[order] if order is not None else t for t in (int4.codes, int4.scale, int4.minimum)]
        return cpu_weights.NativeInt4Weight.from_codes(*parts)
    int8 = gguf_file.int8_blocks(tensor) if cpu_weights.NativeInt8Weight.fits_shape(rows, inputs) else None
    if int8 is not None:
        parts = [t[order] if order is not None else t for t in (int8.codes, int8.scale)]
        return cpu_weights.NativeInt8Weight.from_codes(*parts)
    return None


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
