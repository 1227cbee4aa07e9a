"""Integration on the real default base: generation, PEFT equivalence, the embedded registry."""

import json

import pytest
import torch

from tests.conftest import REPO, run_cli
from zenedge import bases
from zenedge.runtime.engine import Engine, Prompt
from zenedge.runtime.generate import SamplingParams

pytestmark = pytest.mark.slow


def test_the_default_base_converts_to_the_pinned_identity(real_store):
    row = real_store.base("smollm2-135m")
    assert row["sha256"] == bases.DEFAULT_BASE_SHA256
    assert row["modules"]["model.layers.0.self_attn.q_proj"] == [576, 576]


def test_greedy_answer_on_the_real_base(real_store, real_cfg):
    engine = Engine(real_store, real_cfg)
    out = engine.complete("smollm2-135m", Prompt(messages=[{"role": "user", "content": "What is the capital of France?"}]),
                          SamplingParams(max_tokens=16))
    assert "Paris" in out.text


def test_a_peft_lora_on_the_real_base_equals_peft(real_store, real_cfg, real_base_dir, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from zenedge import pool

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(real_base_dir)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.01)
    peft_model.save_pretrained(tmp_path / "lora")
    pool.import_lora(real_store, real_cfg, tmp_path / "lora", "probe")
    engine = Engine(real_store, real_cfg)
    route = engine.router.route("probe")
    resident = engine.resident(route.base)
    input_ids = torch.randint(10, 40000, (1, 24))
    with torch.inference_mode(), resident.state.using([engine.variant(route)]):
        ours = resident.model(input_ids=input_ids).logits
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(real_base_dir), tmp_path / "lora").eval()
    with torch.no_grad():
        expected = reference(input_ids=input_ids).logits
    assert (ours - expected).abs().max() < 1e-4


def embedded_profiles():
    index = REPO / "profiles" / "index.json"
    return json.loads(index.read_text())["profiles"] if index.exists() else []


@pytest.mark.skipif("writer" not in {p["name"] for p in embedded_profiles()},
                    reason="the embedded registry has no writer profile yet")
def test_pull_writer_from_the_embedded_registry_and_run_it(real_store, real_cfg):
    listed = json.loads(run_cli("search", "--json", check=True).stdout)
    assert {p["name"] for p in listed} >= {"writer"} and all(p["kind"] in ("lora", "bitdelta") for p in listed)
    pulled = json.loads(run_cli("pull", "writer", "--json", check=True).stdout)
    assert pulled["name"] == "writer"
    out = json.loads(run_cli("run", "writer", "Explain what a Python generator is.", "--max-tokens", "24",
                             "--json", check=True).stdout)
    assert out["completion_tokens"] > 0 and out["text"].strip()


def test_int4_weights_keep_the_real_bases_answer_loss(real_base_dir):
    """The CPU default (`runtime.weights = "auto"` → int4): teacher-forced answer loss on two
    embedded eval sets within 0.03 nats of fp32 (measured: ≤ 0.01; an int4 head would cost 0.06)."""
    from zenedge.evaluation import answer_loss, encode_examples, load_eval_set
    from zenedge.runtime.model import load_resident

    cpu = torch.device("cpu")
    losses = {}
    for weights in ("full", "int4"):
        resident = load_resident("b", real_base_dir, cpu, torch.float32, weights)
        for name in ("writer", "arith"):
            encoded = encode_examples(resident.tokenizer, load_eval_set(REPO / "profiles" / name / "eval.jsonl")[:16], 256)
            with torch.inference_mode(), resident.state.using([None]):
                losses[weights, name] = answer_loss(resident.model, encoded, 8, resident.tokenizer.pad_token_id)
    for name in ("writer", "arith"):
        assert losses["int4", name] != losses["full", name]            # it did run quantized
        assert abs(losses["int4", name] - losses["full", name]) < 0.03, losses


def test_import_is_a_first_command_in_a_fresh_home(isolated_home):
    """`zenedge import` before any pull or run: it converts the default base itself, with progress,
    then stores the adapter; later commands find both."""
    profile = REPO / "profiles" / "arith"
    result = run_cli("import", str(profile / "adapter"), "--name", "mine", "--eval", str(profile / "eval.jsonl"))
    assert result.returncode == 0, result.stderr
    assert "setting up the base smollm2-135m" in result.stdout and "imported mine (lora" in result.stdout
    assert "Converting" not in result.stderr  # transformers' own bars stay off the terminal
    listed = json.loads(run_cli("list", "--json", check=True).stdout)
    assert [row["name"] for row in listed] == ["mine"]
    assert json.loads(run_cli("base", "list", "--json", check=True).stdout)[0]["name"] == "smollm2-135m"
    refused = run_cli("merge", "mine")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("error: a merge needs at least two different adapters")
