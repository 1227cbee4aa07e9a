"""A base whose resident form does not fit the memory free now is refused before loading, with
the bytes it needs and the bytes free (never a swap storm or an OOM kill)."""

from collections import namedtuple

import pytest
import torch

from zenedge.errors import Unavailable
from zenedge.runtime import model as model_module
from zenedge.runtime.model import load_resident, resident_bytes


def test_resident_bytes_count_every_stored_parameter(tiny_base_dir):
    from transformers import AutoModelForCausalLM

    params, needed = resident_bytes(tiny_base_dir, torch.float32, "int4")
    loaded = AutoModelForCausalLM.from_pretrained(tiny_base_dir)
    stored = {name: p for name, p in loaded.state_dict().items()}    # a tied head is stored once
    assert params == sum(p.numel() for name, p in stored.items() if name != "lm_head.weight" or
                         not loaded.config.tie_word_embeddings)
    assert resident_bytes(tiny_base_dir, torch.bfloat16, "full")[1] == int(params * 4 * model_module.LOAD_HEADROOM)
    assert needed < resident_bytes(tiny_base_dir, torch.float32, "full")[1]     # no fp32 linears kept


@pytest.mark.parametrize("tied", [True, False], ids=["tied-head", "untied-head"])
def test_a_quantized_residents_estimate_covers_what_it_holds(tmp_path, tied):
    from tests.conftest import make_tiny_base
    from zenedge.runtime.resident_file import copies_of

    base = make_tiny_base(tmp_path / "base", tied=tied)
    _, needed = resident_bytes(base, torch.float32, "int4")
    resident = load_resident("tiny", base, torch.device("cpu"), torch.float32, "int4")
    held = sum(copy.nbytes for copy in copies_of(resident.model).values()) + sum(
        p.numel() * p.element_size() for p in resident.model.parameters() if p.device.type != "meta")
    assert held <= needed <= 4 * held


def test_a_base_that_does_not_fit_is_refused_before_loading(tiny_base_dir, monkeypatch):
    import psutil

    memory = namedtuple("memory", "available")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory(available=1000))
    loaded = []
    monkeypatch.setattr(model_module, "load_causal_lm", lambda *a, **k: loaded.append(a))
    refused = r"base 'tiny' needs about .* of memory to load \([\d,]+ parameters as float32, weights 'int4'\); 1000 B"
    with pytest.raises(Unavailable, match=refused):
        load_resident("tiny", tiny_base_dir, torch.device("cpu"), torch.float32, "int4")
    assert loaded == []   # refused before any weight was read
    monkeypatch.undo()   # the machine's own memory: the tiny base fits
    assert load_resident("tiny", tiny_base_dir, torch.device("cpu"), torch.float32, "full").model is not None
