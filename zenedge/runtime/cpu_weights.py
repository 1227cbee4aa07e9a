"""Fast CPU copies of linear weights, used only for matmuls: oneDNN-packed bf16, int8, int4.

A decode step on CPU is a chain of matrix-vector products bound by how fast the weights stream
from memory, so the lever is fewer bytes per weight read by a kernel that keeps up:

- `OneDnnBF16`: a bf16 weight reordered once into oneDNN's blocked layout (the op inductor's
  freezing pass emits). torch's plain bf16 F.linear converts as it goes and runs no faster than
  fp32; the packed one does. Used when the model itself is bf16.
- `Int8Weight`: weight-only int8, one scale per output channel (`aten._weight_int8pack_mm`).
- `Int4Weight`: weight-only int4, asymmetric, one scale and zero per 32 inputs
  (`aten._weight_int4pack_mm_for_cpu`, the CPU twin of gpt-fast's tinygemm path): a quarter of
  the bf16 bytes (plus 1/8 for scales), at a small cost in answer loss (BENCHMARKS.md).
- `NativeInt4Weight`: the same int4 weights (same bytes, same dequantized values) multiplied by
  zenedge's own C kernel (kernels/native/int4_gemv.c, built on first use where a C compiler is
  found), which rounds x to int16 per group of 32 (finer than bf16) and sums in integers: it
  takes and returns fp32 and keeps close to memory speed at one row. The int4 format's default
  wherever it builds; `Int4Weight` everywhere else. `runtime.activations = "int8"` rounds x to
  int8 instead: twice the products per instruction, which a many-row read (prefill, scoring) is
  bound by, at about 5e-3 of a product's size instead of 2e-5 (BENCHMARKS.md).
- `NativeInt8Weight`: int8 in groups of 32 inputs with an fp16 scale each (llama.cpp's Q8_0),
  zenedge's C kernel (kernels/native/int8_gemv.c): the output head of an int4 model where it builds
  (the largest weight of a step, about half of bf16's bytes); for the embedded base, whose GGUF
  stores that weight as Q8_0, exactly the file's numbers.

torch's quantized kernels want bf16 activations (their fp32 paths are far slower), so `linear`
casts x to bf16 and the result back: two tiny copies per matmul, whatever the model's dtype (the
C kernels round x themselves: to int16 for int4 W, not at all for the Q8_0 head).
For "full" and bf16 the plain weight stays the model's parameter beside its packed copy. For int4
and int8 the copy is the weight: a resident loads straight into it (quantized_load.py, or its
resident file: resident_file.py) and keeps no plain linear; prefill and the quality gate multiply
with the copy too, and `dequantized()` gives its numbers where a weight is asked for.

`runtime.weights` picks the format: "full" (the model dtype's own weights, packed when bf16),
"int8" or "int4"; CPU only. A weight whose shape a kernel cannot take stays plain.

A decode step calls `matmul_fn`'s kernel directly (layers.py binds them once per request),
and reads q/k/v and gate/up through one `stacked` int4 copy each: one kernel call instead of
three or two, bit for bit the same products.

`settle` stacks those groups when a model is converted (or a BitDelta densified) and moves the C
kernels' copies into 2 MB pages: streaming a model's weights through 4 KB pages, a core spends
much of its time on TLB misses.
This module knows weights, not models: it imports nothing else of the runtime. Giving a model its
copies is `transforms.convert_model`; the head's wrapper module is `layers.FastLinear`.
"""

from __future__ import annotations

import math
import mmap
import threading
import weakref

import torch
import torch.nn.functional as F

from zenedge.kernels import native

ACTIVATIONS = ("int16", "int8")   # runtime.activations
_activations = ["int16"]          # the process's setting (`set_activations`)


def set_activations(setting: str) -> None:
    """How NativeInt4Weight rounds x, process-wide (the engine, from `runtime.activations`):
    "int16", or "int8" for every product run from Python (prefill, the quality gate's scoring; the
    C decode step reads one row, bound by memory, and keeps int16)."""
    if setting not in ACTIVATIONS:
        raise ValueError(f"activations {setting!r} is not one of {', '.join(ACTIVATIONS)}")
    _activations[0] = setting


def int8_activations() -> bool:
    """Whether an int4 product rounds x to int8 (`set_activations`)."""
    return _activations[0] == "int8"


def rounds_inputs_to_int8(weights: str) -> bool:
    """Whether a model whose `runtime.weights` format is `weights` multiplies x rounded to int8:
    only NativeInt4Weight does, where the C kernels load (torch's int4 kernel takes bf16 x)."""
    return weights == "int4" and int8_activations() and native.int4_gemm_x8() is not None


class CpuWeight:
    """A matmul-only copy of an [out, in] weight: `linear(x, bias)` == F.linear(x, W, bias) up to
    the format's rounding."""

    nbytes: int
    # True when the copy rounds the plain weight (int8/int4, bf16 of an fp32 weight): a forward
    # that asks for the plain weights (prefill, scoring: layers.VariantState.plain) then gets them.
    lossy = False

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        flat = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])   # decode steps are 2-D already
        y = self._matmul(flat)
        if bias is not None:
            y = y + bias
        return y if x.dim() == 2 else y.view(*x.shape[:-1], y.shape[-1])

    def _matmul(self, flat: torch.Tensor) -> torch.Tensor:  # [N, in] → [N, out], in flat's dtype
        raise NotImplementedError

    def _product(self, flat: torch.Tensor) -> torch.Tensor:
        """`_matmul` without casting the kernel's output (bf16 for the quantized kernels) back."""
        return self._matmul(flat)

    def matmul_fn(self, bias: torch.Tensor | None, *, cast: bool = True):
        """`x [N, in] → linear(x, bias)` for 2-D x with as little Python as possible between the
        caller and the kernel: the lean decode step makes one of these calls per linear per token,
        and the wrappers around a kernel cost a sizeable share of it. `cast=False`: the result may stay
        in the kernel's dtype, for a caller that only adds it to an fp32 tensor (type promotion
        widens it exactly as the cast would: the same sum, one op fewer)."""
        product = self._matmul if cast else self._product
        if bias is not None:
            return lambda x: product(x) + bias
        return product


class OneDnnBF16(CpuWeight):
    """bf16 in oneDNN's blocked layout (batch hint 1: laid out for decode). Also the output head
    of an int8 model, and of an int4 one where the int8 kernel does not build: its rounding lands
    straight in the logits, where an int4 head costs far more answer loss than a bf16 one
    (BENCHMARKS.md)."""

    def __init__(self, weight: torch.Tensor):
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(torch.bfloat16), 1)
        self.nbytes = weight.numel() * 2
        self.lossy = weight.dtype != torch.bfloat16

    @staticmethod
    def fits(weight: torch.Tensor) -> bool:
        return weight.is_floating_point() and onednn_bf16_available()

    def _matmul(self, flat):
        # The casts are no-ops for a bf16 model; an fp32 model's head goes through bf16 and back.
        return self._product(flat).to(flat.dtype)

    def _product(self, flat):
        return torch.ops.mkldnn._linear_pointwise(flat.to(torch.bfloat16), self.packed, None, "none", [], "")


class Int8Weight(CpuWeight):
    """Symmetric int8 per output channel: W ≈ q · s[out]."""

    lossy = True

    def __init__(self, weight: torch.Tensor):
        w = weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
        self.q = (w / scale[:, None]).round_().clamp_(-127, 127).to(torch.int8)
        self.scale = scale.to(torch.bfloat16)
        self.nbytes = self.q.numel() + self.scale.numel() * 2

    @staticmethod
    def fits(weight: torch.Tensor) -> bool:
        return True

    def _matmul(self, flat):
        return self._product(flat).to(flat.dtype)

    def _product(self, flat):
        return torch._weight_int8pack_mm(flat.to(torch.bfloat16), self.q, self.scale)

    def dequantized(self) -> torch.Tensor:
        return self.q.float() * self.scale.float()[:, None]


class Int4Weight(CpuWeight):
    """Asymmetric int4 in groups of GROUP inputs: W ≈ (q - 8)·scale + zero, q ∈ [0, 15] (the
    kernel's convention: `zero` is the value of the middle code, not an integer offset)."""

    GROUP = 32
    lossy = True

    def __init__(self, weight: torch.Tensor):
        q, scale, zero = _int4_quantized(weight, self.GROUP)
        # [in/GROUP, out, 2]: what the kernel reads, bf16 like the activations it is given.
        self.scale_zero = torch.stack([scale, zero], -1).transpose(0, 1).contiguous()
        self.packed = torch._convert_weight_to_int4pack_for_cpu(q, 2)
        self.nbytes = self.packed.numel() * self.packed.element_size() + self.scale_zero.numel() * 2

    @classmethod
    def fits(cls, weight: torch.Tensor) -> bool:
        out, inp = weight.shape
        return out % 16 == 0 and inp % cls.GROUP == 0    # the packing kernel's tiles

    def _matmul(self, flat):
        return self._product(flat).to(flat.dtype)

    def _product(self, flat):
        return torch._weight_int4pack_mm_for_cpu(flat.to(torch.bfloat16), self.packed, self.GROUP, self.scale_zero)

    @classmethod
    def stacked(cls, parts: list["Int4Weight"]) -> "Int4Weight | None":
        """One copy multiplying by the parts' weights stacked on the output axis, bit for bit
        their products side by side (the kernel's 64-row blocks are independent), or None when
        a part's rows do not fill whole blocks. The parts' packed codes become views of the
        stacked ones: no extra memory beyond the scales."""
        if len(parts) < 2 or any(p.packed.shape[0] % 64 or p.packed.shape[1] != parts[0].packed.shape[1]
                                 for p in parts):
            return None
        stacked = cls.__new__(cls)
        stacked.packed = torch.cat([p.packed for p in parts])
        stacked.scale_zero = torch.cat([p.scale_zero for p in parts], dim=1)
        stacked.nbytes = sum(p.nbytes for p in parts)
        start = 0
        for p in parts:
            rows = p.packed.shape[0]
            p.packed = stacked.packed[start:start + rows]
            start += rows
        return stacked

    def dequantized(self) -> torch.Tensor:
        """The weight the kernel multiplies by, in fp32 (for tests and quality checks)."""
        eye = torch.eye(self.scale_zero.shape[0] * self.GROUP, dtype=torch.bfloat16)
        return self._matmul(eye).float().t().contiguous()


class NativeInt4Weight(CpuWeight):
    """The same int4 weights as Int4Weight (same codes, scales and zeros: the same dequantized
    W, the same bytes), multiplied by zenedge's C kernel (kernels/native/int4_gemv.c: x rounded to
    int16 per group of 32), fp32 in and out:
    no casts around the call, laid out in blocks of 16 rows (native.int4_layout). Used where the
    kernel builds, the inputs are whole 64-wide blocks and the rows whole blocks of 16. Blocks are
    independent: stacked copies share the parts' memory entirely."""

    GROUP = 32
    lossy = True

    def __init__(self, weight: torch.Tensor):
        q, scale, zero = _int4_quantized(weight, self.GROUP)
        # blocks of 16 rows side by side (native.int4_layout: the kernel's layout)
        self.codes, self.scale, self.zero = native.int4_layout(q, scale, zero)
        self._set_size()

    def _set_size(self):
        self.rows, self.inputs = self.codes.shape[0] * native.BLOCK_ROWS, self.codes.shape[1] * 8
        self.nbytes = self.codes.numel() + (self.scale.numel() + self.zero.numel()) * self.scale.element_size()
        # bf16 scales: zenedge's quantizer, W = (q - 8)·s + z; fp16 or fp32: a GGUF file's blocks
        # kept as they are, W = q·s + m (native.SCALE_KINDS)
        self.kind = native.SCALE_KINDS[self.scale.dtype]
        # What every call passes, looked up once: the pointers together with their tensors, in
        # one attribute, so a call that read it holds the memory it points to even if `stacked`
        # swaps the tensors for views of a stacked copy meanwhile (another thread).
        self._kernel, self._kernel_x8 = native.int4_gemm_scaled(), native.int4_gemm_x8()
        tensors = (self.codes, self.scale, self.zero)
        self._weights = (tensors, tuple(t.data_ptr() for t in tensors))

    @classmethod
    def fits(cls, weight: torch.Tensor) -> bool:
        return cls.fits_shape(*weight.shape)

    @staticmethod
    def fits_shape(rows: int, inputs: int) -> bool:
        """Whether the kernel builds here and takes a [rows, inputs] weight."""
        return inputs % 64 == 0 and inputs <= native.MAX_INPUTS and rows % native.BLOCK_ROWS == 0 \
            and native.int4_gemm() is not None

    def _matmul(self, flat):
        if flat.shape[-1] != self.inputs:   # the kernel trusts its shapes: check them here
            raise ValueError(f"input has {flat.shape[-1]} features, the weight {self.inputs}")
        x = flat.float().contiguous()
        y = torch.empty((x.shape[0], self.rows), dtype=torch.float32)   # what the kernel writes
        held, pointers = self._weights                  # `held` keeps the weights alive for the call
        kernel = self._kernel_x8 if int8_activations() else self._kernel
        # the kernel splits its output rows over this thread's count (threads.pace sets it)
        if kernel(x.data_ptr(), *pointers, y.data_ptr(), x.shape[0], self.rows, self.inputs, self.kind):
            raise MemoryError("the int4 kernel could not allocate its scratch")
        return y if flat.dtype == torch.float32 else y.to(flat.dtype)

    TENSORS = ("codes", "scale", "zero")      # what `settle` moves and a resident file holds

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], rows: int, inputs: int) -> "NativeInt4Weight":
        """The copy whose TENSORS are `tensors` (as a resident file holds them: resident_file.py)."""
        copy = cls.__new__(cls)
        copy.codes, copy.scale, copy.zero = (tensors[name] for name in cls.TENSORS)
        copy._set_size()
        if (copy.rows, copy.inputs) != (rows, inputs):
            raise ValueError(f"int4 tensors of a {copy.rows}x{copy.inputs} weight, not {rows}x{inputs}")
        return copy

    @classmethod
    def from_codes(cls, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> "NativeInt4Weight":
        """The copy of codes q [out, in] (0..15) with scale and zero [out, in/GROUP]: bf16 for
        W = (q - 8)·s + z, fp16 or fp32 for W = q·s + z (a GGUF file's blocks: gguf_file.py)."""
        copy = cls.__new__(cls)
        copy.codes, copy.scale, copy.zero = native.int4_layout(q, scale, zero)
        copy._set_size()
        return copy

    @classmethod
    def stacked(cls, parts: list["NativeInt4Weight"]) -> "NativeInt4Weight | None":
        """One copy for the parts stacked on the output axis; the parts become views of it."""
        if not cls.can_stack(parts):
            return None
        stacked = cls.__new__(cls)
        stacked.codes, stacked.scale, stacked.zero = (torch.cat([getattr(p, name) for p in parts])
                                                      for name in cls.TENSORS)
        stacked._parts = [weakref.ref(p) for p in parts]
        stacked._moved()
        return stacked

    @staticmethod
    def can_stack(parts: list) -> bool:
        """Whether `parts` stack into one copy: two or more of this class, one input width, one
        scale kind."""
        return len(parts) >= 2 and all(type(p) is NativeInt4Weight for p in parts) \
            and len({p.inputs for p in parts}) == 1 and len({p.kind for p in parts}) == 1

    def _moved(self):
        """After its tensors were replaced (made, or moved by `settle`): the pointers, and the
        parts it was stacked from as views of its rows."""
        self._set_size()
        start = 0
        for ref in getattr(self, "_parts", ()):
            p = ref()
            if p is None:
                continue
            blocks = p.rows // native.BLOCK_ROWS
            p.codes, p.scale, p.zero = (getattr(self, name)[start:start + blocks] for name in self.TENSORS)
            p._set_size()
            start += blocks

    def dequantized(self) -> torch.Tensor:
        """The weight the kernel multiplies by, in fp32 (for tests and quality checks)."""
        q = native.int4_codes(self.codes).float().view(self.rows, -1, self.GROUP)
        scale, zero = (t.transpose(1, 2).reshape(self.rows, -1, 1).float() for t in (self.scale, self.zero))
        if self.kind == native.SCALE_KINDS[torch.bfloat16]:
            q -= 8
        return (q * scale + zero).view(self.rows, self.inputs)


class NativeInt8Weight(CpuWeight):
    """Symmetric int8 in groups of GROUP inputs, W ≈ q·scale with one fp16 scale per group
    (llama.cpp's Q8_0: a weight that came from a Q8_0 tensor gets exactly its codes and scales
    back), multiplied by zenedge's C kernel (kernels/native/int8_gemv.c), fp32 in and out. Groups of
    32 follow the embedding's outlier columns, which per-channel int8 scales lose (BENCHMARKS.md)."""

    GROUP = 32
    lossy = True

    CHUNK_ROWS = 4096      # rows widened to fp32 at a time: an 8B head whole would be 0.8 GB more

    def __init__(self, weight: torch.Tensor):
        out, inp = weight.shape
        scales = torch.empty((out, inp // self.GROUP), dtype=torch.float16)   # fp16 [out, in/GROUP]
        codes = torch.empty((out, inp), dtype=torch.int8)
        for start in range(0, out, self.CHUNK_ROWS):
            rows = slice(start, start + self.CHUNK_ROWS)
            groups = weight[rows].detach().float().view(-1, inp // self.GROUP, self.GROUP)
            scales[rows] = (groups.abs().amax(-1) / 127).half()
            scale = scales[rows].float()[..., None]
            # codes from the stored (fp16) scale, so W ≈ q·scale holds for the numbers the kernel reads
            q = groups / scale.masked_fill(scale == 0, 1.0)            # an all-zero group: codes 0
            codes[rows] = q.round_().clamp_(-127, 127).to(torch.int8).view(-1, inp)
        # blocks of 16 rows side by side (native.int8_layout: the kernel's layout)
        self.codes, self.scale = native.int8_layout(codes, scales)
        self.rows, self.inputs = out, inp
        self.nbytes = self.codes.numel() + self.scale.numel() * 2
        self._kernel = native.int8_gemm()

    TENSORS = ("codes", "scale")

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scale: torch.Tensor) -> "NativeInt8Weight":
        """The copy of int8 codes [out, in] with fp16 scales [out, in/GROUP] (a GGUF Q8_0 tensor's)."""
        blocked, scales = native.int8_layout(codes, scale)
        return cls.from_tensors({"codes": blocked, "scale": scales}, *codes.shape)

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], rows: int, inputs: int) -> "NativeInt8Weight":
        """The copy whose TENSORS are `tensors` (as a resident file holds them: resident_file.py)."""
        copy = cls.__new__(cls)
        copy.codes, copy.scale = (tensors[name] for name in cls.TENSORS)
        if copy.codes.shape[1] != inputs or -(-rows // native.BLOCK_ROWS) != copy.codes.shape[0]:
            raise ValueError(f"int8 tensors of shape {tuple(copy.codes.shape)} do not hold a {rows}x{inputs} weight")
        copy.rows, copy.inputs = rows, inputs
        copy.nbytes = copy.codes.numel() + copy.scale.numel() * 2
        copy._kernel = native.int8_gemm()
        return copy

    def _moved(self):
        pass                             # its pointers are read per call

    @classmethod
    def fits(cls, weight: torch.Tensor) -> bool:
        return cls.fits_shape(*weight.shape) \
            and bool(weight.detach().abs().amax() < 127 * torch.finfo(torch.float16).max)

    @classmethod
    def fits_shape(cls, rows: int, inputs: int) -> bool:
        """Whether the kernel builds here and takes a weight of `inputs` inputs (any rows)."""
        return inputs % cls.GROUP == 0 and inputs <= native.MAX_INPUTS and native.int8_gemm() is not None

    def _matmul(self, flat):
        if flat.shape[-1] != self.inputs:   # the kernel trusts its shapes: check them here
            raise ValueError(f"input has {flat.shape[-1]} features, the weight {self.inputs}")
        x = flat.float().contiguous()
        y = torch.empty((x.shape[0], self.rows), dtype=torch.float32)
        kernel, codes, scale = self._kernel, self.codes, self.scale

        kernel(x.data_ptr(), codes.data_ptr(), scale.data_ptr(), y.data_ptr(), x.shape[0], self.rows, self.inputs)
        return y if flat.dtype == torch.float32 else y.to(flat.dtype)

    def dequantized(self) -> torch.Tensor:
        """The weight the kernel multiplies by, in fp32 (for tests and quality checks)."""
        codes, scale = (t.transpose(1, 2).reshape(-1, t.shape[1])[:self.rows] for t in (self.codes, self.scale))
        groups = codes.float().view(self.rows, -1, self.GROUP) * scale.float()[..., None]
        return groups.view(self.rows, self.inputs)


def _int4_quantized(weight: torch.Tensor, group: int):
    """Asymmetric int4 codes of `weight` [out, in] in groups of `group` inputs: (q int32 [out, in]
    in 0..15, scale, zero) with scale and zero [out, in/group] in bf16, W ≈ (q - 8)·scale + zero."""
    out, inp = weight.shape
    groups = weight.detach().float().view(out, inp // group, group)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).clamp(min=1e-8)
    q = ((groups - low[..., None]) / scale[..., None]).round_().clamp_(0, 15).to(torch.int32).view(out, inp)
    return q, scale.to(torch.bfloat16), (low + 8 * scale).to(torch.bfloat16)


_FORMATS = {"bf16": OneDnnBF16, "int8": Int8Weight, "int4": Int4Weight}


def onednn_bf16_available() -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def quantized_kernels_available(fmt: str) -> bool:
    """Whether this torch build has the CPU kernel for `fmt` ("int8" / "int4")."""
    name = {"int8": "_weight_int8pack_mm", "int4": "_weight_int4pack_mm_for_cpu"}[fmt]
    return hasattr(torch, name) or hasattr(torch.ops.aten, name)


def _format_class(weight: torch.Tensor, fmt: str) -> type[CpuWeight] | None:
    if weight.device.type != "cpu" or weight.dim() != 2:
        return None
    if fmt == "full":     # the dtype's own weights: only bf16 gains from a packed layout
        return OneDnnBF16 if weight.dtype == torch.bfloat16 and OneDnnBF16.fits(weight) else None
    if fmt == "int4" and NativeInt4Weight.fits(weight):
        return NativeInt4Weight
    if fmt == "q8":       # Q8_0 through the C kernel where it builds, else packed bf16
        if NativeInt8Weight.fits(weight):
            return NativeInt8Weight
        fmt = "bf16"
    cls = _FORMATS[fmt]
    return cls if cls.fits(weight) else None


def fast_copy(weight: torch.Tensor, fmt: str) -> CpuWeight | None:
    """The fast copy of a CPU weight in format `fmt` ("full", "bf16", "int8", "int4", "q8"), or None
    where the plain weight is what runs (fp32 "full", a shape the kernel cannot take, a non-CPU
    tensor)."""
    cls = _format_class(weight, fmt)
    return cls(weight) if cls is not None else None


_stacking = threading.Lock()


def stacked(parts: list) -> CpuWeight | None:
    """A copy for the parts' weights stacked on the output axis (q/k/v, gate/up read one input:
    one kernel call instead of three or two), equal bit for bit to the parts' products side by
    side; None where the format or the shapes do not allow it. Made once and kept on the first
    part, so it lives as long as the parts do (a BitDelta's dense copies are dropped with it)."""
    kind = type(parts[0]) if parts else None
    if kind not in (Int4Weight, NativeInt4Weight) or any(type(p) is not kind for p in parts):
        return None
    with _stacking:
        made = getattr(parts[0], "_stacked", None)
        if made is None or made[0] != tuple(parts[1:]):     # (the others, not the first: no cycle)
            made = (tuple(parts[1:]), kind.stacked(parts))
            parts[0]._stacked = made
    return made[1]


# What lean_llama multiplies as one product: (parent module).(these names), stacked by `settle`.
STACKED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
_HUGE_PAGE = 2 << 20


def settle(copies: dict) -> None:
    """{module name: its fast copy}: stack each q/k/v and gate/up group (as `stacked` would, as
    lean_llama will ask for them) and move the C kernels' copies into one block of 2 MB pages,
    each group stacked straight into it. Products are unchanged (the same bytes, elsewhere).
    Where the OS gives no such pages, the groups are stacked (`stacked`) and the copies stay put.
    Copies already there (a resident file read in place) are left alone."""
    natives = (NativeInt4Weight, NativeInt8Weight)
    units = {}                     # id(part) → its group's parts, or the stacked copy made already
    for names in stack_groups(copies):
        parts = [copies[name] for name in names]
        if NativeInt4Weight.can_stack(parts):
            made = getattr(parts[0], "_stacked", None)
            unit = made[1] if made is not None and made[0] == tuple(parts[1:]) else parts
            units.update((id(p), unit) for p in parts)
    moves, seen = [], set()        # each: a copy to move, or parts to stack into the block
    for copy in copies.values():
        unit = units.get(id(copy), copy)
        if id(unit) not in seen and (isinstance(unit, list) or isinstance(unit, natives) and not getattr(unit, "settled", False)):
            seen.add(id(unit))
            moves.append(unit)
    specs = []
    for unit in moves:
        parts = unit if isinstance(unit, list) else [unit]
        specs += [((sum(getattr(p, name).shape[0] for p in parts), *getattr(parts[0], name).shape[1:]),
                   getattr(parts[0], name).dtype) for name in parts[0].TENSORS]
    block = settled_block(specs)
    if block is None:
        for unit in moves:
            if isinstance(unit, list):
                stacked(unit)
        return
    places = iter(block)
    for unit in moves:            # unit by unit, each old copy freed once moved: peak = one copy more
        if isinstance(unit, list):
            whole = {name: torch.cat([getattr(p, name) for p in unit], out=next(places)) for name in NativeInt4Weight.TENSORS}
            owner = NativeInt4Weight.from_tensors(whole, sum(p.rows for p in unit), unit[0].inputs)
            adopt_stacked(owner, unit)
        else:
            owner = unit
            for name in owner.TENSORS:
                moved = next(places)
                moved.copy_(getattr(owner, name))
                setattr(owner, name, moved)
            owner._moved()
        owner.settled = True
        release_freed_memory()         # the old copy's pages back to the OS now, not at exit


def settled_block(specs: list[tuple[tuple[int, ...], torch.dtype]]) -> list[torch.Tensor] | None:
    """Fresh tensors of these (shape, dtype)s side by side in one block of 2 MB pages, each
    64-byte aligned: where `settle` puts copies, and where a resident file is read straight into
    (resident_file.py). None where the OS gives no such pages."""
    sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in specs]
    block = _huge_pages(sum(_aligned(n) for n in sizes))
    if block is None:
        return None
    tensors, at = [], 0
    for (shape, dtype), size in zip(specs, sizes):
        tensors.append(block[at:at + size].view(dtype).view(shape))
        at += _aligned(size)
    return tensors


def adopt_stacked(whole: "NativeInt4Weight", parts: list["NativeInt4Weight"]) -> None:
    """Make `whole` (its tensors hold the parts' rows in order, the parts' tensors views of them:
    a resident file read in place) what `stacked(parts)` returns, with no copy made."""
    with _stacking:
        whole._parts = [weakref.ref(p) for p in parts]
        whole._moved()
        parts[0]._stacked = (tuple(parts[1:]), whole)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 64) * 64


def release_freed_memory() -> None:
    """Hand memory freed since the last call back to the OS. glibc keeps freed blocks of up to
    32 MB in its heaps for reuse, and a load frees one such block per weight (the widened
    weight a copy is made from, a copy moved by `settle`): without this, an 8B base's load
    peaked at twice its resident size. Elsewhere than glibc, nothing to do."""
    global _trim
    if _trim is None:
        import ctypes
        import ctypes.util

        try:
            _trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _trim = False
    if _trim:
        _trim(0)


_trim = None


def stack_groups(copies: dict):
    """Names of each STACKED_GROUPS group found whole in `copies` (keys: module names), per parent
    module."""
    for parent in {name.rpartition(".")[0] for name in copies}:
        for group in STACKED_GROUPS:
            names = [f"{parent}.{child}" if parent else child for child in group]
            if all(name in copies for name in names):
                yield names


def _huge_pages(nbytes: int) -> torch.Tensor | None:
    """`nbytes` of fresh memory as a uint8 tensor, 2 MB aligned and advised to the kernel as huge
    pages before it is first touched (Linux: transparent huge pages in "madvise" or "always"
    mode); None where that advice cannot be given."""
    if nbytes == 0 or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    try:
        buffer = mmap.mmap(-1, nbytes + _HUGE_PAGE, flags=mmap.MAP_PRIVATE)
        buffer.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError):
        return None
    whole = torch.frombuffer(buffer, dtype=torch.uint8)          # keeps the mapping alive
    skip = (-whole.data_ptr()) % _HUGE_PAGE
    return whole[skip:skip + nbytes]


def linear(x: torch.Tensor, weight: torch.Tensor | CpuWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear for a plain weight or a fast copy."""
    if isinstance(weight, CpuWeight):
        return weight.linear(x, bias)
    return F.linear(x, weight, bias)
