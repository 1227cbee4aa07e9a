"""Reading whole texts: right-padded rows through the model's decoder stack (no LM head), after an
optional prefix every row shares. Teacher-forced scoring (evaluation.py, the quality gate) and
embeddings (embed.py) read text through this one forward, with whatever weights the caller applied
(the plain ones: layers.VariantState.plain).

It is transformers' own decoder forward, so any causal LM reads exactly as transformers computes
it. Generation does not come here: its prefill and decode steps run the lean forward
(lean_llama.py) into a static KV cache, with the same math up to op order, not the same bits.
"""

from __future__ import annotations

import inspect
from typing import Sequence

import torch

# One layer's keys and values of a prefix: [B, heads, P, head_dim] each.
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
                  prefix: KeysValues | None = None) -> torch.Tensor:
    """The decoder's last hidden states [B, T, hidden] of right-padded rows. `prefix`: every layer's
    keys and values of tokens that precede every row (`prefix_states`, one row's repeated or each
    row's own), read as cached context instead of again."""
    decoder = decoder_of(model)
    kwargs = {}
    if prefix is not None:
        from transformers import DynamicCache

        cache = DynamicCache()
        for layer, (keys, values) in enumerate(prefix):
            cache.update(keys, values, layer)
        kwargs[cache_argument(decoder)] = cache
        attention_mask = torch.cat([attention_mask.new_ones(attention_mask.shape[0], prefix[0][0].shape[2]),
                                    attention_mask], 1)
    return decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs).last_hidden_state


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
