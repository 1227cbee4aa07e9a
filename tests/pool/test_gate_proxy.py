"""The gate's data-free proxy reads the generic prompts' shared start once (weighted by the prompts
it stands for) and gives the numbers of reading every prompt whole; the base's side is read once
per resident model; a refused attempt measured again (least-loss) does not re-read its proxies."""

import json

import torch

from tests.pool.conftest import set_config
from zenedge import pool
from zenedge.adapters.lora_tensors import read_lora_factors
from zenedge.evaluation import shared_length
from zenedge.pool import gate as gate_module
from zenedge.pool.gate import GENERIC_PROMPTS, QualityGate
from zenedge.runtime.prompts import chat_ids
from zenedge.runtime.variants import lora_variant


def _variant(engine, lora_dir):
    resident = engine.resident("tiny")
    factors = read_lora_factors(lora_dir / "adapter_model.safetensors",
                                json.loads((lora_dir / "adapter_config.json").read_text()), dtype=torch.float32)
    return resident, lora_variant("probe", factors, resident)


def test_the_shared_start_read_once_gives_the_whole_prompts_numbers(engine, peft_adapter):
    resident, variant = _variant(engine, peft_adapter(seed=3))
    gate = QualityGate(resident)
    rows = [chat_ids(resident.tokenizer, [{"role": "user", "content": p}]) for p in GENERIC_PROMPTS]
    skip = shared_length(rows)
    assert skip > 0
    fast, weights = gate._read_after_prefix(variant, rows, skip)
    whole, _ = gate._read_whole(variant, rows)
    expanded, at = [], skip
    for row in rows:        # each prompt is the shared start, then its own tokens
        expanded += [fast[:skip], fast[at:at + len(row) - skip]]
        at += len(row) - skip
    assert at == len(fast) and len(whole) == sum(len(row) for row in rows)
    torch.testing.assert_close(torch.cat(expanded), whole, atol=1e-4, rtol=1e-4)
    assert weights[:skip].eq(len(rows)).all() and weights[skip:].eq(1).all()


def test_the_base_side_is_read_once_per_resident_model(engine, peft_adapter):
    resident, variant = _variant(engine, peft_adapter(seed=4))
    gate_module._BASE_LOG_PROBS.pop(resident.model, None)
    first = QualityGate(resident).proxy(variant, variant)
    assert first == 1.0                                  # the merged variant is the member's own
    base = gate_module._BASE_LOG_PROBS[resident.model]
    assert QualityGate(resident).proxy(variant, variant) == 1.0
    assert gate_module._BASE_LOG_PROBS[resident.model] is base


def test_a_refused_attempt_measured_again_keeps_its_proxy(store, tmp_path, make_profile):
    """Least-loss admission measures a refused attempt on every member; a member judged by the
    proxy was judged whole already, and is not read again."""
    a_dir, _ = make_profile("alpha", 1, with_eval=False)
    b_dir, _ = make_profile("beta", 7, with_eval=False)
    size = (a_dir / "adapter_model.safetensors").stat().st_size
    cfg = set_config(tmp_path, f'[pool]\nbudget = "{int(size * 1.6)}B"\nquality_threshold = 0.999\n')
    pool.import_lora(store, cfg, a_dir, "alpha", base="tiny")
    result = pool.import_lora(store, cfg, b_dir, "beta", base="tiny")
    gates = [p for p in result.profile["phases"] if p["phase"] == "gate"]
    assert gates, result.profile
    assert len([g for g in gates if g.get("member") == "alpha"]) == 1, gates


def test_anchors_measured_another_way_are_measured_again(engine, peft_adapter, tmp_path):
    """An original member's stored anchors count only when they were read as the gate reads now
    (its scorer: `runtime.activations = "int8"` names another); else the gate measures them anew."""
    from zenedge.pool.gate import Member
    from zenedge.pool.phases import Phases

    resident, variant = _variant(engine, peft_adapter(seed=5))
    gate = QualityGate(resident)
    eval_path = tmp_path / "eval.jsonl"
    eval_path.write_text("".join(json.dumps({"prompt": f"Compute {i} + 1.", "answer": str(i + 1)}) + "\n"
                                 for i in range(4)))
    digest, examples = gate.encoded(eval_path)
    n = len(examples)
    per_example = {"order": digest, "base": [1.0] * n, "own": [0.5] * n, "base_hits": [0] * n, "own_hits": [1] * n}

    def prepared(scorer: str):
        quality = {"metric": "loss", "scorer": scorer, "per_example": per_example}
        return gate._prepare(Member("p", eval_path, quality, variant, True), Phases())

    assert prepared(gate.scorer).base == [1.0] * n
    again = prepared(gate.scorer + "-x8")
    assert again.base == [] and again.own == [] and again.population == n
