"""A lean functional forward for Llama-architecture models, used by the static-cache steppers.

Decoding a small model at batch 1 on a CPU, much of transformers' own forward is not matmuls:
some thousand small ops, module calls, hooks, mask and cache plumbing, output dataclasses. This
forward does the same math in the fewest ops we know, on the model's own
modules: the embedding, the rotary embedding (every rope scaling transformers supports stays
right), the target linears (VariantLinear: per-row variants still apply), the activation, the
output head (possibly a wrapper). Only the glue between them (RMSNorm, rope, attention, the
residual adds) is done here, with transformers' numerics up to op order (fp32 RMSNorm and the
decode step's attention run in zenedge's C kernels where they build, kernels/native/, else
torch's ops): fp32 logits agree up to float rounding; bf16 ones differ by bf16 rounding and stay
as close to fp32 as transformers' own. Where every layer allows it, the whole decode step runs as
one C call (c_step.py), bit for bit the Python step's numbers.

A decode step's rows are different requests, and a request must decode the same tokens alone as
in any batch, so no op of a step mixes rows or changes its summation order with their number:
rope is elementwise (a batched matmul takes another BLAS path for one row), cos/sin come from a
table computed once (the vectorised and scalar cos differ in the last bit), attention runs per row
over that row's own length, the linears' kernels are row-invariant (cpu_weights, layers).

It serves exactly what `decode._Forward` serves: `prefill` (one row's chunk of prompt tokens
[1, T], its positions, an additive causal mask [1, 1, T, L], a `static_cache.RowChunk`) → logits
[1, V] of the last token, and `step` (one token per row [n], a `static_cache.StepView`) → logits
[n, V]. `supported(model)` accepts only the structures whose math is checked to be Llama's (table
below); anything else keeps the transformers path.

To force the transformers path on a model (tests, benchmarks): `set_enabled(model, False)`.
"""

from __future__ import annotations

import importlib
import logging
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from zenedge.kernels import native
from zenedge.runtime.c_step import FusedStep
from zenedge.runtime.layers import bound, products

log = logging.getLogger("zenedge.runtime")
_logged_refusals: set[str] = set()

# model_type → (transformers module, class-name prefix). Mistral and Qwen2 are Llama's math exactly
# once no layer slides its window (their only difference; the rule below refuses sliding): same
# RMSNorm, rotary embedding, attention (Qwen2's q/k/v biases live in the modules we call), MLP,
# residual order. Anything else (Qwen3's q/k norms, Granite's multipliers, ...) is refused.
ARCHITECTURES = {
    "llama": ("transformers.models.llama.modeling_llama", "Llama"),
    "mistral": ("transformers.models.mistral.modeling_mistral", "Mistral"),
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2"),
}
_PARTS = ("ForCausalLM", "Model", "DecoderLayer", "Attention", "MLP", "RMSNorm", "RotaryEmbedding")
_ENABLED_ATTR = "_zenedge_lean_enabled"
# SDPA groups query heads over KV heads itself since torch 2.5; before, the keys are repeated.
_SDPA_GQA = torch.torch_version.TorchVersion(torch.__version__) >= (2, 5)


def set_enabled(model: nn.Module, enabled: bool) -> None:
    """Let (True, the default) or stop (False) the steppers using the lean forward on `model`."""
    setattr(model, _ENABLED_ATTR, enabled)


def supported(model: nn.Module) -> bool:
    return unsupported_reason(model) is None


def lean_forward(model: nn.Module, batch=None) -> "LeanLlama | None":
    """The lean forward of `model` for one request's `batch` (its RowVariants), or None when it is
    disabled or the model is not supported. Checked and built per request, so a module swapped or
    hooked after loading is picked up."""
    reason = refusal(model)
    if reason is not None:
        if reason not in _logged_refusals:   # a fall-off from the fast path is never silent
            _logged_refusals.add(reason)
            log.warning("decoding with transformers' forward, not the lean one (several times slower): %s", reason)
        return None
    return LeanLlama(model, batch)


def refusal(model: nn.Module) -> str | None:
    """Why `lean_forward` gives no lean forward for `model` (None: it gives one)."""
    if not getattr(model, _ENABLED_ATTR, True):
        return "turned off for this model (lean_llama.set_enabled)"
    return unsupported_reason(model)


def unsupported_reason(model: nn.Module) -> str | None:
    """Why the lean forward would not compute what transformers computes (None: it would)."""
    config = getattr(model, "config", None)
    entry = ARCHITECTURES.get(getattr(config, "model_type", None))
    if entry is None:
        return f"model type {getattr(config, 'model_type', None)!r} is not in the table"
    try:
        module = importlib.import_module(entry[0])
        kinds = {part: getattr(module, entry[1] + part) for part in _PARTS}
    except (ImportError, AttributeError) as exc:
        return f"this transformers has no {entry[1]} classes: {exc}"
    if type(model) is not kinds["ForCausalLM"] or type(getattr(model, "model", None)) is not kinds["Model"]:
        return "not the plain causal-LM class"
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return f"attention implementation {getattr(config, '_attn_implementation', None)!r}"
    if getattr(config, "pretraining_tp", 1) not in (1, None):
        return "pretraining_tp > 1"
    if any(kind != "full_attention" for kind in (getattr(config, "layer_types", None) or ())):
        return "not every layer is full attention"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    if model.training:
        return "training mode (dropout)"
    if getattr(model, "use_kernels", False):
        return "hub kernels replace module forwards"
    if torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks:
        return "global module hooks"
    inner = model.model
    layers = list(inner.layers)[:config.num_hidden_layers]
    if not isinstance(inner.embed_tokens, nn.Embedding) or type(inner.norm) is not kinds["RMSNorm"] \
            or type(inner.rotary_emb) is not kinds["RotaryEmbedding"]:
        return "unexpected embedding, final norm or rotary embedding"
    skipped = [model, inner, inner.norm]   # modules whose forward we replace: none may carry hooks
    for layer in layers:
        if type(layer) is not kinds["DecoderLayer"] or type(layer.self_attn) is not kinds["Attention"] \
                or type(layer.mlp) is not kinds["MLP"] or type(layer.input_layernorm) is not kinds["RMSNorm"] \
                or type(layer.post_attention_layernorm) is not kinds["RMSNorm"] or not hasattr(layer.self_attn, "scaling"):
            return "unexpected decoder layer structure"
        skipped += [layer, layer.self_attn, layer.mlp, layer.input_layernorm, layer.post_attention_layernorm,
                    layer.mlp.act_fn]   # SiLU modules are replaced by F.silu
    for m in skipped:
        # hooks, or a forward patched on the instance (accelerate's offloading, hub kernels)
        if m._forward_hooks or m._forward_pre_hooks or "forward" in vars(m):
            return f"{type(m).__name__} has hooks or a patched forward"
    return None


class LeanLlama:
    """The forward of one supported model, its modules looked up once."""

    def __init__(self, model: nn.Module, batch=None):
        inner = model.model
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm = _norm(inner.norm)
        self.head = model.lm_head
        heads = model.config.num_attention_heads
        # One flat tuple per layer, unpacked in the loop: no attribute lookups per token.
        self.layers = []
        for i, layer in enumerate(list(inner.layers)[:model.config.num_hidden_layers]):
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append((
                i, _norm(layer.input_layernorm), attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
                heads, heads // attn.num_key_value_groups, attn.head_dim, attn.scaling,
                _norm(layer.post_attention_layernorm), mlp.gate_proj, mlp.up_proj, mlp.down_proj,
                _activation(mlp.act_fn)))
        # A decode step's linears, bound once for the request (layers.py: the per-row variants):
        # where no row's variant touches a linear, its kernel is called directly, skipping the
        # module and wrapper calls; q/k/v and gate/up then run as one product each where their
        # copies stack. o and down only feed residual adds: their
        # kernels' bf16 outputs are added as they are (cast=False, the same sums).
        self.step_layers = [(i, norm1, products((q, k, v), batch), bound(o, batch, cast=False), heads, kv_heads,
                             dim, _decode_attention(heads, kv_heads, dim, scaling, self.embed.weight),
                             ((heads + kv_heads) * dim, kv_heads * dim),
                             norm2, products((gate, up), batch), bound(down, batch, cast=False),
                             _gated(act, gate.weight.shape[0], up.weight.shape[0], self.embed.weight))
                            for i, norm1, q, k, v, o, heads, kv_heads, dim, scaling, norm2, gate, up, down, act
                            in self.layers]
        self.step_head = bound(self.head, batch)
        self.rope = RopeTable.of(self.rotary, self.embed.weight.dtype, self.embed.weight.device)
        # The whole step in one C call where every layer allows it (bit for bit _decode's numbers).
        self.fused = FusedStep.build(model, self, batch)

    def prefill(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
        """One row's chunk of prompt tokens, multiplied with the plain weights (VariantState.plain,
        which only the modules know about). input_ids, positions: [1, T]; mask: [1, 1, T, L]
        additive; cache.update(k, v, i) → [1, H_kv, L, D]."""
        x = self.embed(input_ids)                                           # [1, T, hidden]
        cos, sin = self.rope.at(positions, mask.shape[-1], x)               # [1, T, D] each
        x = self._prefill(x, cos[:, :, None], sin[:, :, None], mask, cache)[:, -1]
        return self.head(self.norm(x))                                      # [1, hidden] → [1, V]

    def step(self, input_ids: torch.Tensor, view) -> torch.Tensor:
        """One token per row, input_ids: [n]; view: the cache's StepView → logits [n, V]."""
        x = self.embed(input_ids)                                           # [n, hidden]
        cos, sin = self.rope.at(view.positions, view.mask.shape[-1], x)     # [n, D] each
        if self.fused is None or not self.fused(x, cos, sin, view):         # (x updated in place when it runs)
            x = self._decode(x, cos[:, None], sin[:, None], view)
        return self.step_head(self.norm(x))

    def _decode(self, x, cos, sin, view):
        """x: [n, hidden] (2-D all the way: the linears skip matmul's reshapes); cos, sin: [n, 1, D]."""
        batch = x.shape[0]
        for i, norm1, qkv_proj, o_proj, heads, kv_heads, dim, attend, qk_v, norm2, gate_up, down, gated \
                in self.step_layers:
            qk, v = qkv_proj(norm1(x)).split_with_sizes(qk_v, -1)          # [n, (H + H_kv)·D], [n, H_kv·D]
            qk = _rotate(qk.view(batch, heads + kv_heads, dim), cos, sin)    # q and k in one go
            q, k = qk.split_with_sizes((heads, kv_heads), 1)
            write, keys, values = view.layers[i]
            write(k, v.view(batch, kv_heads, dim))
            x = x + o_proj(attend(q, keys, values, view))
            x = x + down(gated(gate_up(norm2(x))))
        return x

    def _prefill(self, x, cos, sin, mask, cache):
        """Any number of tokens of one row, x: [1, T, hidden]; cos, sin: [1, T, 1, D]."""
        batch, width = x.shape[:2]
        for i, norm1, q_proj, k_proj, v_proj, o_proj, heads, kv_heads, dim, scaling, norm2, gate, up, down, act in self.layers:
            h = norm1(x)
            q = _rotate(q_proj(h).view(batch, width, heads, dim), cos, sin)
            k = _rotate(k_proj(h).view(batch, width, kv_heads, dim), cos, sin)
            v = v_proj(h).view(batch, width, kv_heads, dim)
            keys, values = cache.update(k.transpose(1, 2), v.transpose(1, 2), i)
            out = _attention(q.transpose(1, 2), keys, values, mask, scaling, heads // kv_heads)
            x = x + o_proj(out.transpose(1, 2).reshape(batch, width, heads * dim))
            h = norm2(x)
            x = x + down(act(gate(h)) * up(h))
        return x


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rope: x·cos + rotate_half(x)·sin, with `sin` signed (RopeTable): rotate_half(x)·sin ==
    roll(x, D/2)·signed sin, no slices, no cat. Elementwise, rounded as transformers rounds it."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


class RopeTable:
    """cos and sin of every position, from the model's own rotary embedding (every rope scaling it
    supports), computed once per model, dtype and device and looked up by position: the same
    numbers for a position whatever the batch (computed elementwise per call, a batch's size would
    decide which of them take the vectorised cos and which the scalar one). sin comes with its
    first half negated, as `_rotate` takes it. Rope types that change their frequencies with the
    longest position in a call ("dynamic", "longrope") are computed per call, as transformers does."""

    _ATTR = "_zenedge_rope_tables"

    def __init__(self, rotary: nn.Module, dtype: torch.dtype, device: torch.device):
        self.rotary, self.dtype, self.device = rotary, dtype, device
        rope_type = getattr(rotary, "rope_type", "default")
        self.per_call = not isinstance(rope_type, str) or "dynamic" in rope_type or rope_type == "longrope"
        self.tables: tuple | None = None     # (cos [N, D], signed sin [N, D], the inv_freq they came from)

    @classmethod
    def of(cls, rotary: nn.Module, dtype: torch.dtype, device: torch.device) -> "RopeTable":
        tables = rotary.__dict__.setdefault(cls._ATTR, {})    # kept on the module: it lives as long as the model
        key = (dtype, torch.device(device))
        if key not in tables:
            tables[key] = cls(rotary, dtype, device)
        return tables[key]

    def at(self, positions: torch.Tensor, length: int, like: torch.Tensor):
        """(cos, signed sin) [*positions.shape, D] for positions below `length` (a host int: no sync)."""
        if self.per_call:
            flat = positions.reshape(1, -1)
            cos, sin = self.rotary(like, flat)
            return self._shaped(cos[0], _signed(sin[0]), positions)
        cos, sin = self._table(length)
        index = positions.reshape(-1)
        return self._shaped(cos.index_select(0, index), sin.index_select(0, index), positions)

    @staticmethod
    def _shaped(cos, sin, positions):
        shape = (*positions.shape, cos.shape[-1])
        return cos.view(shape), sin.view(shape)

    def _table(self, length: int):
        inv_freq = getattr(self.rotary, "inv_freq", None)
        source = None if inv_freq is None else (inv_freq.data_ptr(), inv_freq._version)
        tables = self.tables
        if tables is None or tables[0].shape[0] < length or tables[2] != source:
            size = max(256, 1 << (max(length, 1) - 1).bit_length())        # powers of two: few rebuilds
            positions = torch.arange(size, device=self.device)[None]
            cos, sin = self.rotary(torch.empty((), dtype=self.dtype, device=self.device), positions)
            tables = self.tables = (cos[0], _signed(sin[0]), source)
        return tables[0], tables[1]


def _signed(sin: torch.Tensor) -> torch.Tensor:
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _gated(act, gate_width: int, up_width: int, like: torch.Tensor):
    """gate and up side by side [n, G + U] → act(gate)·up: SiLU through the C kernel where it
    builds (the one the C step calls, so both round alike), else torch's ops."""
    silu_mul = native.silu_mul_fn(gate_width) if act is F.silu and gate_width == up_width \
        and like.dtype == torch.float32 and like.device.type == "cpu" else None
    if silu_mul is not None:
        return silu_mul

    def gated(gu):
        g, u = gu.split_with_sizes((gate_width, up_width), -1)
        return act(g) * u
    return gated


def _decode_attention(heads: int, kv_heads: int, dim: int, scaling: float, like: torch.Tensor):
    """One query per row: (q [n, H, D], keys/values [n, H_kv, L, D], the StepView) → [n, H·D],
    each row over its own first `view.lengths` positions: through the C kernel where it takes the
    tensors (kernels/native/decode_attention.c: fp32 on the CPU, the dtype and device of `like`), else
    SDPA one row at a time (the same call alone as in a batch), else (a CUDA graph's step, whole
    buffers, no host lengths) SDPA under the mask."""
    native_attend = native.decode_attention_fn(heads, kv_heads, dim, scaling, like.dtype, like.device)
    groups = heads // kv_heads

    def attend(q, keys, values, view):
        batch = q.shape[0]
        if native_attend is not None:
            out = native_attend(q, keys, values, view.lengths)
            if out is not None:
                return out.view(batch, heads * dim)
        # [n, H, D] is [n, H_kv, H/H_kv, D] in memory (query head h reads KV head h // groups), so
        # grouped attention needs no repeated keys.
        grouped = q.view(batch, kv_heads, groups, dim)
        if view.host_lengths is None:
            out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=view.mask, scale=scaling)
            return out.view(batch, heads * dim)
        rows = [F.scaled_dot_product_attention(grouped[b:b + 1], keys[b:b + 1, :, :n], values[b:b + 1, :, :n],
                                               scale=scaling)
                for b, n in enumerate(view.host_lengths)]
        return torch.cat(rows).view(batch, heads * dim)
    return attend


def _activation(module: nn.Module):
    """F.silu itself for transformers' SiLU modules (one module call fewer per layer), else the module."""
    from transformers import activations

    if type(module) in (nn.SiLU, getattr(activations, "SiLUActivation", nn.SiLU)):
        return F.silu
    return module


def _attention(q, keys, values, mask, scaling, groups):
    # q: [B, H, T, D]; keys, values: [B, H_kv, L, D] → [B, H, T, D]
    if groups > 1 and not _SDPA_GQA:
        keys, values = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
    extra = {"enable_gqa": True} if groups > 1 and _SDPA_GQA else {}
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scaling, **extra)


def _norm(module: nn.Module):
    """LlamaRMSNorm as one function: fp32 statistics, cast back, then × weight (its numerics)."""
    weight, eps = module.weight, module.variance_epsilon
    shape = weight.shape
    if weight.dtype == torch.float32:
        # the casts are identities: one fused op, the C kernel's where it builds (torch's CPU
        # rms_norm is a dozen small ops, and a token runs 2 × layers + 1 of them)
        fused = native.rms_norm_fn(weight, eps) or partial(F.rms_norm, normalized_shape=shape, weight=weight, eps=eps)

        def fp32_weight(x):
            if x.dtype == torch.float32:
                return fused(x)
            return weight * F.rms_norm(x.float(), shape, None, eps).to(x.dtype)
        return fp32_weight

    def rms_norm(x):
        return weight * F.rms_norm(x.float(), shape, None, eps).to(x.dtype)
    return rms_norm
