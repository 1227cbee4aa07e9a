"""Hub kernels never replace the forward zenedge decodes with (issue [V]).

transformers 5.25 kernelizes every model it loads, by default, once PyPI's `kernels` is installed
(transformers itself now depends on it). The lean forward refuses such a model, and every decode
step fell back to transformers' own forward: 185 -> 49 tok/s on the embedded base, while `doctor`
still reported the lean forward.
"""

from __future__ import annotations

import logging

import pytest
import torch

from zenedge.runtime import lean_llama
from zenedge.runtime.decode import decode_path
from zenedge.runtime.model import load_causal_lm, load_resident


def _kernelizing_transformers() -> bool:
    from transformers import PreTrainedModel
    from transformers.utils.import_utils import is_kernels_available

    return hasattr(PreTrainedModel, "set_use_kernels") and is_kernels_available()


def test_a_plain_load_turns_hub_kernels_on_where_transformers_does(tiny_base_dir, monkeypatch):
    """The premise, on the installed stack: where this fails the loader's guard is untested here."""
    if not _kernelizing_transformers():
        pytest.skip("this transformers (or its missing `kernels`) never kernelizes a model")
    from transformers import AutoModelForCausalLM

    monkeypatch.delenv("USE_HUB_KERNELS", raising=False)
    model = AutoModelForCausalLM.from_pretrained(tiny_base_dir).eval()
    assert model.use_kernels
    assert lean_llama.refusal(model) == "hub kernels replace module forwards"


def test_zenedge_loads_every_model_without_hub_kernels(tiny_base_dir, monkeypatch):
    monkeypatch.setenv("USE_HUB_KERNELS", "1")   # on, as a user's environment may have it
    model = load_causal_lm(tiny_base_dir).eval()
    assert not getattr(model, "use_kernels", False)
    assert lean_llama.refusal(model) is None


def test_the_resident_decodes_on_the_lean_forward_and_reports_it(tiny_base_dir, monkeypatch):
    monkeypatch.delenv("USE_HUB_KERNELS", raising=False)
    resident = load_resident("tiny", tiny_base_dir, torch.device("cpu"), torch.float32, "int4")
    path = decode_path(resident.model, resident.device, resident.weights)
    assert (path.forward, path.lean_refused) == ("lean", None)
    assert lean_llama.lean_forward(resident.model) is not None


def test_a_fall_off_from_the_lean_forward_is_logged_once_with_its_reason(tiny_base_dir, caplog, monkeypatch):
    model = load_causal_lm(tiny_base_dir).eval()
    model.model.norm.forward = model.model.norm.forward   # patched on the instance, as hub kernels do
    monkeypatch.setattr(lean_llama, "_logged_refusals", set())
    with caplog.at_level(logging.WARNING, logger="zenedge.runtime"):
        assert lean_llama.lean_forward(model) is None
        assert lean_llama.lean_forward(model) is None
    warnings = [r.getMessage() for r in caplog.records if "not the lean one" in r.getMessage()]
    assert warnings == ["decoding with transformers' forward, not the lean one (several times slower): "
                        "LlamaRMSNorm has hooks or a patched forward"]


def test_doctor_without_a_daemon_reports_the_path_a_load_takes(tiny_base_dir, monkeypatch):
    """`doctor` with no daemon asks the skeleton (no weights read); a daemon's /api/ps asks the
    resident. Both must give the same answer, or doctor says "lean" while the daemon is not."""
    from zenedge.runtime.model import skeleton

    monkeypatch.delenv("USE_HUB_KERNELS", raising=False)
    cpu = torch.device("cpu")
    resident = load_resident("tiny", tiny_base_dir, cpu, torch.float32, "int4")
    loaded = decode_path(resident.model, cpu, "int4")
    guessed = decode_path(skeleton(tiny_base_dir), cpu, "int4")
    assert (guessed.stepper, guessed.forward, guessed.lean_refused) == \
           (loaded.stepper, loaded.forward, loaded.lean_refused) == ("static", "lean", None)
