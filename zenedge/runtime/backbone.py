"""Reading whole texts: right-padded rows through the model's decoder stack (no LM head), after an
optional prefix every row shares. Teacher-forced scoring (evaluation.py, the quality gate) and
embeddings (embed.py) read text through this one forward, with whatever weights the caller applied
(the plain ones: layers.VariantState.plain).

It is transformers' own decoder forward, so any causal LM reads exactly as transformers computes
it. Generation does not come here: its prefill and decode steps run the lean forward
(lean_llama.py) into a static KV cache, with the same math up to op order, not the same bits.
"""

from __future__ import annotations

import functools
import inspect
from typing import Sequence

import torch

# Every layer's keys and values of a prefix: [1, heads, P, head_dim] each, as read_prefix gives them.
KeysValues = Sequence[tuple[torch.Tensor, torch.Tensor]]


def cache_argument(module) -> str:
    """The KV-cache keyword of this transformers version's forwards (`cache` since 5.x,
    `past_key_values` before), looked up once per module."""
    keyword = getattr(module, "_zenedge_cache_kw", None)
    if keyword is None:
        keyword = "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"
        module._zenedge_cache_kw = keyword
    return keyword


def right_padded(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id rows stacked and right padded with `pad_id`: (input_ids [B, T], attention_mask
    [B, T], 1 on real tokens). Right padding is exact for any causal model: a real token never
    attends to the pads after it, and positions count from each row's start."""
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        input_ids[index, : len(row)] = torch.as_tensor(row, dtype=torch.long)
        attention_mask[index, : len(row)] = 1
    return input_ids, attention_mask


def decoder_of(model):
    """The decoder stack of a causal LM (its `base_model`), through a PEFT wrapper: the wrapper's
    `base_model` is its tuner, whose forward gives logits, not hidden states."""
    unwrap = getattr(model, "get_base_model", None)   # PEFT: the model its layers were injected into
    return (unwrap() if unwrap else model).base_model


def hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  prefix: Sequence[KeysValues] | None = None) -> torch.Tensor:
    """The decoder's last hidden states [B, T, hidden] of right-padded rows. `prefix`: per row, the
    keys and values of tokens that precede it (`prefix_states`, each [1, heads, P, head_dim]; rows
    may share one, and rows of different variants have their own), read as cached context instead
    of again."""
    decoder = decoder_of(model)
    kwargs = {}
    if prefix is not None:
        if len(prefix) != input_ids.shape[0]:
            raise ValueError(f"a prefix for {len(prefix)} rows, a batch of {input_ids.shape[0]}")
        kwargs[cache_argument(decoder)] = _prefix_cache(prefix)
        attention_mask = torch.cat([attention_mask.new_ones(attention_mask.shape[0], prefix[0][0][0].shape[2]),
                                    attention_mask], 1)
    return decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs).last_hidden_state


def _batched(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """One layer's keys (or values) of every row's prefix as [B, heads, P, head_dim]: a view where
    every row shares one prefix, else a copy."""
    if all(row is rows[0] for row in rows):
        return rows[0].expand(len(rows), -1, -1, -1)
    return torch.cat(list(rows))


@functools.cache
def _read_only_cache_class():
    """A DynamicCache that gives each layer's attention the rows' prefixes followed by the rows' own
    keys and values, assembled then and kept by no one. transformers' own cache keeps every layer's
    (prefix and rows, at 1.7B 8 rows of 50 tokens 0.15 GB) until the forward ends; a whole-text read
    needs one layer's at a time."""
    from transformers import DynamicCache

    class ReadOnlyPrefixCache(DynamicCache):
        rows_prefix: Sequence[KeysValues] = ()

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            keys = _batched([row[layer_idx][0] for row in self.rows_prefix])
            values = _batched([row[layer_idx][1] for row in self.rows_prefix])
            return torch.cat([keys, key_states], -2), torch.cat([values, value_states], -2)

    return ReadOnlyPrefixCache


def _prefix_cache(prefix: Sequence[KeysValues]):
    """The rows' prefixes as a read-only cache (`_read_only_cache_class`). Its stored layers are the
    first row's, so that its length is the prefix's: the decoder's masks and positions read that
    before the first layer runs."""
    from transformers import DynamicCache

    cache = _read_only_cache_class()()
    for layer, (keys, values) in enumerate(prefix[0]):
        DynamicCache.update(cache, keys, values, layer)
    cache.rows_prefix = prefix
    return cache


@torch.no_grad()
def read_prefix(model, prefix_ids: Sequence[int]) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A prefix (one row) read once: its last hidden states [P, hidden], and its keys and values
    in every layer ([1, heads, P, head_dim] each) for the rows that continue it."""
    device = next(model.parameters()).device
    out = decoder_of(model)(input_ids=torch.tensor([list(prefix_ids)], device=device), use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    return out.last_hidden_state[0], [(layer.keys, layer.values) for layer in cache.layers]


def prefix_states(model, prefix_ids: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys and values of a prefix (one row) in every layer: [1, heads, P, head_dim] each."""
    return read_prefix(model, prefix_ids)[1]
