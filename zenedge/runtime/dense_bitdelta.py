"""Dense BitDelta copies on CPU: reconstructed weights W + α⊙S, inside the delta cache's budget.

A BitDelta variant decodes from its packed signs: the base's int4 pass, shared by every row of a
step, plus the C sign kernel (kernels/native/sign_add.c) on the rows that use it. It is ready as
soon as its file is read and costs its packed bytes only. Where that kernel does not apply (no
native kernels, a bf16 model, inputs not in groups of 32), the packed path is torch's
(kernels/bitdelta/cpu.py: sign products through byte lookup tables), several times a plain
linear per token; a dense copy, rebuilt in well under a second for a 135M base, then decodes at
the base's speed. `runtime.bitdelta_dense` decides: "auto" makes dense copies only where the
packed path has no C kernel, "never" makes none, "always" makes them wherever the budget has room
(a dense int4 copy requantizes W + α⊙S: the delta is rounded into the base's int4 grid).

Budget: the dense copy is charged to the variant itself (`variant.nbytes` grows by the dense
bytes), so the DeltaCache's one byte budget (`runtime.cache_budget`) covers packed deltas, LoRA
factors and dense copies alike, and its rate-weighted eviction sees what each entry really costs.
A variant is densified only into headroom; to make headroom, dense copies of variants with a
lower request rate are dropped first (they fall back to the packed path, they are not evicted).
Variants that never fit stay on the packed path: that is the "cold" path.

On CUDA nothing is densified: the fused Triton kernel reads little more than the base's bytes.
"""

from __future__ import annotations

import threading
import weakref

import torch

from zenedge.runtime import cpu_weights
from zenedge.runtime.cache import DeltaCache
from zenedge.runtime.layers import VariantLinear, plain_weight
from zenedge.runtime.variants import BitDeltaModule, Variant


def dense_nbytes(variant: Variant, model: torch.nn.Module) -> int:
    """Bytes the dense copies of `variant` take: one weight per delta module, in the format the
    base's own matmul uses (plain, packed bf16, int8 or int4: `runtime.weights`)."""
    total = 0
    for name in variant.modules:
        linear = model.get_submodule(name)
        fast, weight = getattr(linear, "fast", None), linear.weight
        total += fast.nbytes if fast is not None else weight.numel() * weight.element_size()
    return total


def _base_weight(model: torch.nn.Module, name: str):
    """(plain weight, fast copy or None) of the base linear `name` (a VariantLinear wraps it)."""
    linear = model.get_submodule(name)
    return plain_weight(linear), getattr(linear, "fast", None)


def densify(variant: Variant, model: torch.nn.Module) -> None:
    """Give every module of a BitDelta variant its dense W + α⊙S (built in fp32, rounded once),
    laid out like the base weight it replaces: a base served from an int4 copy gets an int4 dense
    copy, so a hot variant reads what the base reads."""
    from zenedge.kernels.bitdelta.cpu import reconstruct_weight

    for name, module in variant.modules.items():
        if isinstance(module, BitDeltaModule) and module.dense is None:
            weight, fast = _base_weight(model, name)
            dense = reconstruct_weight(weight, module.packed, module.alpha, dtype=weight.dtype)
            module.dense = type(fast)(dense) if fast is not None else dense
    # stacked and in 2 MB pages as the base's copies are (cpu_weights.settle): read as fast
    cpu_weights.settle({name: module.dense for name, module in variant.modules.items()
                        if isinstance(module, BitDeltaModule) and isinstance(module.dense, cpu_weights.CpuWeight)})


def undensify(variant: Variant) -> None:
    for module in variant.modules.values():
        if isinstance(module, BitDeltaModule):
            module.dense = None


class DenseBitDeltas:
    """Which cached BitDelta variants hold dense weights; one per Engine, next to its DeltaCache."""

    def __init__(self, cache: DeltaCache):
        self.cache = cache
        self._lock = threading.Lock()
        # key → (weak reference to the densified Variant, bytes charged to it)
        self._dense: dict[str, tuple[weakref.ref, int]] = {}
        self.densified = 0   # counters for ps/tests
        self.dropped = 0

    def prepare(self, variant: Variant | None, model: torch.nn.Module, policy: str = "auto") -> Variant | None:
        """Called per request with the cached variant: densify it when it is a BitDelta variant on
        CPU, `policy` (runtime.bitdelta_dense) asks for it, and the budget has (or can make) room.
        Returns the variant, dense or not."""
        if variant is None or not variant.is_bitdelta or _device_of(model).type != "cpu" or policy == "never":
            return variant
        if policy == "auto" and packed_path_is_native(variant, model):
            return variant
        with self._lock:
            self._forget_evicted()
            if self._is_dense(variant):
                return variant
            extra = dense_nbytes(variant, model)
            if not self._make_room(extra, variant.key):
                return variant                       # cold: the memory-bounded packed path
            densify(variant, model)
            variant.nbytes += extra                  # charged to the variant: the cache sees it
            self._dense[variant.key] = (weakref.ref(variant), extra)
            self.densified += 1
        return variant

    def dense_keys(self) -> list[str]:
        with self._lock:
            self._forget_evicted()
            return sorted(self._dense)

    def drop_all(self) -> None:
        """Give the dense copies back (memory pressure, a budget change); variants stay cached."""
        with self._lock:
            for key in list(self._dense):
                self._drop(key)

    # -- internals (lock held) -----------------------------------------------------------------
    def _is_dense(self, variant: Variant) -> bool:
        ref = self._dense.get(variant.key)
        return ref is not None and ref[0]() is variant

    def _forget_evicted(self) -> None:
        """The cache evicted (or replaced) some variants: their dense copies go with them, freed
        when the last request using them ends (a running request keeps its numerics)."""
        for key, (ref, _) in list(self._dense.items()):
            if ref() is None or key not in self.cache:
                del self._dense[key]

    def _make_room(self, extra: int, key: str) -> bool:
        headroom = self.cache.budget - self.cache.used_bytes
        if headroom >= extra:
            return True
        rates = {entry["key"]: entry["rate"] for entry in self.cache.snapshot()}
        mine = rates.get(key, 0.0)
        for other in sorted(self._dense, key=lambda k: rates.get(k, 0.0)):
            if rates.get(other, 0.0) > mine:        # never demote a hotter variant for a colder one
                break
            headroom += self._drop(other)
            if headroom >= extra:
                return True
        return False

    def _drop(self, key: str) -> int:
        ref, extra = self._dense.pop(key)
        variant = ref()
        if variant is None:
            return 0
        undensify(variant)
        variant.nbytes -= extra
        self.dropped += 1
        return extra


_NATIVE_ATTR = "_zenedge_packed_path_native"


def packed_path_is_native(variant: Variant, model: torch.nn.Module) -> bool:
    """Whether every module of a BitDelta variant decodes through the C sign kernel: an fp32 model
    on the C int4 kernel and a delta the sign kernel takes (VariantLinear.sign_kernel). Asked per
    request and decided by the variant and its base alone: kept on the variant."""
    known = variant.__dict__.get(_NATIVE_ATTR)
    if known is None:
        known = next(model.parameters()).dtype == torch.float32 and all(
            isinstance(linear := model.get_submodule(name), VariantLinear) and linear.sign_kernel(module) is not None
            for name, module in variant.modules.items() if isinstance(module, BitDeltaModule))
        variant.__dict__[_NATIVE_ATTR] = known
    return known


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
