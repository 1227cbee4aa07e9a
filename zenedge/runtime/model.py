"""The resident base: a plain transformers causal LM loaded from the store, patched once so that
its target linears can carry per-row variants."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from zenedge.runtime.layers import VariantState
from zenedge.runtime import cpu_weights, resident_file
from zenedge.runtime.quantized_load import QUANTIZED, load_quantized
from zenedge.runtime.resident_file import ResidentCache
from zenedge.runtime.transforms import convert_model, patch_model
from zenedge.runtime.static_cache import KVCachePool


@dataclass
class ResidentModel:
    name: str
    model: torch.nn.Module
    tokenizer: object
    state: VariantState
    device: torch.device
    dtype: torch.dtype
    load_seconds: float
    eos_ids: tuple[int, ...]
    weights: str = "full"                # CPU matmul weight format (cpu_weights.py)
    kv_pool: KVCachePool | None = None   # static KV caches reused across requests (decode.py)
    graphs: bool = True                  # capture the decode step in a CUDA graph (CUDA only)

    def __post_init__(self):
        if self.kv_pool is None:
            self.kv_pool = KVCachePool.for_model(self.model, self.dtype, self.device)

    @property
    def target_modules(self) -> list[str]:
        return self.state.modules

    @property
    def context_length(self) -> int:
        """Positions the base was trained for (its max_position_embeddings): a request's prompt
        and generated tokens together never go past them (generate.check_fits)."""
        return int(self.model.config.max_position_embeddings)


def load_resident(name: str, directory: Path, device: torch.device, dtype: torch.dtype,
                  weights: str = "full", cache: ResidentCache | None = None) -> ResidentModel:
    """Load a Hugging Face directory (config.json + safetensors) as the resident base. On CPU its
    linears get fast matmul copies in the `weights` format (cpu_weights.py: packed bf16 when the
    dtype is bf16, int8 / int4 when asked). int8 / int4: `cache` is where the base's resident
    file is read from, or written after quantizing (resident_file.py)."""
    check_memory(name, directory, dtype, weights if device.type == "cpu" else "full")
    start = time.perf_counter()
    quantized = device.type == "cpu" and weights in QUANTIZED
    # the resident file is read while transformers, the tokenizer and the model's code load
    reading = resident_file.start_reading(cache, weights, dtype) if quantized and cache is not None else None
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our CLI reports progress itself
    hf_logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    loaded = load_quantized(directory, dtype, weights, reading) if quantized else None
    if loaded is not None:        # the decoder's linears as int4/int8 only
        model, state = loaded.model, loaded.state
    else:
        model = load_causal_lm(directory, dtype=dtype, use_safetensors=True)
        model.to(device).eval()
        model.requires_grad_(False)
        state = patch_model(model, device)
    if device.type == "cpu":
        convert_model(model, weights, drop_plain=weights in QUANTIZED, copies=loaded.copies if loaded else None)
        if loaded is not None and not loaded.from_file and cache is not None:
            resident_file.save(model, cache, weights, dtype)      # the next load reads, not quantizes
    cpu_weights.release_freed_memory()       # what quantizing freed (glibc keeps it otherwise)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    eos = model.generation_config.eos_token_id
    eos_ids = tuple(eos if isinstance(eos, (list, tuple)) else [eos if eos is not None else tokenizer.eos_token_id])
    return ResidentModel(name, model, tokenizer, state, device, dtype, time.perf_counter() - start, eos_ids, weights)


# Bytes per parameter of the fast CPU copy each `runtime.weights` format adds beside the model's
# own weights (cpu_weights.py; int4 and int8 with their scales). "full" adds a packed copy in bf16.
FAST_COPY_BYTES = {"full": 0.0, "int8": 1.1, "int4": 0.6, "q8": 1.1}
# A quantized resident (quantized_load.py) holds its decoder linears in these bytes per weight
# instead (int4: 4 bits, a bf16 scale and zero per 32; int8: 8 bits, a scale per row), its head in
# the head's format (Q8_0 for int4, bf16 for int8), and its other tensors in the model's dtype.
QUANTIZED_BYTES = {"int4": 0.625, "int8": 1.0}
QUANTIZED_HEAD_BYTES = {"int4": 1.0625, "int8": 2.0}
LOAD_HEADROOM = 1.15   # allocator slack, the KV cache pool and the tokenizer, on top of the weights


def resident_bytes(directory: Path, dtype: torch.dtype, weights: str) -> tuple[int, int]:
    """(parameters, bytes) of the base in `directory` once resident, at the peak of its load:
    read from its config and safetensors headers, before any weight is loaded."""
    import json

    from zenedge.adapters.safetensors_file import read_header

    from zenedge import gguf_file

    if (Path(directory) / gguf_file.FILENAME).is_file():      # a GGUF file stored as it is
        shapes = gguf_file.shapes(Path(directory) / gguf_file.FILENAME)
    else:
        shapes = [t.shape for path in sorted(Path(directory).glob("*.safetensors"))
                  for t in read_header(path).tensors.values()]
    params = sum(math.prod(shape) for shape in shapes)
    if weights not in QUANTIZED:
        copy = 2.0 if weights == "full" and dtype == torch.bfloat16 else FAST_COPY_BYTES.get(weights, 2.0)
        return params, int(params * (dtype.itemsize + copy) * LOAD_HEADROOM)
    config = json.loads((Path(directory) / "config.json").read_text())
    vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    tables = [math.prod(s) for s in shapes if len(s) == 2 and vocab in s]       # embedding, untied head
    linears = sum(math.prod(s) for s in shapes if len(s) == 2) - sum(tables)
    head = QUANTIZED_HEAD_BYTES[weights] * (max(tables) if tables else 0)
    kept = (params - linears - (sum(tables) - max(tables) if len(tables) > 1 else 0)) * dtype.itemsize
    widest = max((math.prod(s) for s in shapes), default=0) * 4 * 2    # one tensor widened while quantized
    return params, int((linears * QUANTIZED_BYTES[weights] + head + kept + widest) * LOAD_HEADROOM)


def check_memory(name: str, directory: Path, dtype: torch.dtype, weights: str) -> None:
    """Refuse a base whose resident form does not fit the memory free now, before loading it: a
    clear error instead of a swap storm or the kernel's OOM killer."""
    import psutil

    from zenedge.errors import Unavailable
    from zenedge.sizes import format_size

    params, needed = resident_bytes(directory, dtype, weights)
    free = psutil.virtual_memory().available
    if needed > free:
        raise Unavailable(f"base {name!r} needs about {format_size(needed)} of memory to load ({_count(params)} "
                          f"parameters as {str(dtype).removeprefix('torch.')}, weights {weights!r}); "
                          f"{format_size(free)} is free",
                          hint="close other programs, or use a smaller base or `runtime.weights = \"int4\"`")


def _count(params: int) -> str:
    return f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.0f}M" if params >= 1e6 else f"{params:,}"


def load_causal_lm(source, **kwargs) -> torch.nn.Module:
    """transformers' `AutoModelForCausalLM.from_pretrained(source, **kwargs)`, as zenedge loads every
    model: without hub kernels. Since 5.25, transformers kernelizes every model it loads once PyPI's
    `kernels` is installed (a dependency of it now), replacing module forwards; the lean forward
    refuses such a model, and on the embedded base each decode step then took about 15 ms more in
    transformers' own forward (issue [V]). zenedge's kernels are its own, and nothing is fetched
    from a hub."""
    from transformers import AutoModelForCausalLM, PreTrainedModel

    from zenedge import gguf_file

    if hasattr(PreTrainedModel, "set_use_kernels"):   # a transformers that knows hub kernels
        kwargs.setdefault("use_kernels", False)
    if isinstance(source, (str, Path)) and (Path(source) / gguf_file.FILENAME).is_file():
        # a base stored as its GGUF file: transformers dequantizes it (training, references)
        kwargs.pop("use_safetensors", None)
        kwargs["gguf_file"] = gguf_file.FILENAME
    return AutoModelForCausalLM.from_pretrained(source, **kwargs)


def skeleton(directory: Path) -> torch.nn.Module:
    """The model `load_resident` would load from `directory`, without its weights (on the meta
    device, in eval mode): its classes and config, which decide its decode path (`doctor` asks
    without loading a base)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(directory)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return model.eval()
