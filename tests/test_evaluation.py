"""zenedge.evaluation (and the benchmarks' greedy exact match, zenedge.bench.exact_match) on a tiny
random llama + the real SmolLM2 tokenizer (the default base's, converted once per session)."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from zenedge.bench.exact_match import exact_match, greedy_completions
from zenedge.evaluation import (
    EvalSetError, Example, answer_loss, encode_examples, example_losses, load_eval_set, right_padded_batch,
)


EXAMPLES = [
    Example("Compute 3 + 4.", "7"),
    Example("Extract name as JSON: Ana lives in Lyon.", '{"name": "Ana"}'),
    Example("Say hello in French, please, and nothing else at all.", "Bonjour"),
    Example("Name a prime.", "Seven is a prime number, and so is eleven.", system="Be brief."),
]


@pytest.fixture(scope="module")
def tokenizer(real_base_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(real_base_dir)


@pytest.fixture(scope="module")
def model(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tokenizer),
                         max_position_embeddings=512)
    return LlamaForCausalLM(config).eval()


def test_encode_splits_template_into_prompt_and_answer(tokenizer):
    (enc,) = encode_examples(tokenizer, [EXAMPLES[0]], max_len=256)
    assert tokenizer.decode(enc.prompt_ids).endswith("<|im_start|>user\nCompute 3 + 4.<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.decode(enc.answer_ids) == "7<|im_end|>"  # the template's trailing newline is not scored
    assert enc.stop_id == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_encode_uses_system_message_when_given(tokenizer):
    (enc,) = encode_examples(tokenizer, [EXAMPLES[3]], max_len=256)
    prompt = tokenizer.decode(enc.prompt_ids)
    assert "Be brief." in prompt and "SmolLM" not in prompt


def test_encode_truncates_answer_and_rejects_prompt_that_does_not_fit(tokenizer):
    (full,) = encode_examples(tokenizer, [EXAMPLES[3]], max_len=256)
    (cut,) = encode_examples(tokenizer, [EXAMPLES[3]], max_len=len(full.prompt_ids) + 3)
    assert cut.answer_ids == full.answer_ids[:3]
    with pytest.raises(EvalSetError, match="does not fit"):
        encode_examples(tokenizer, [EXAMPLES[3]], max_len=len(full.prompt_ids))


def test_answer_loss_equals_direct_computation(model, tokenizer):
    encoded = encode_examples(tokenizer, EXAMPLES, max_len=256)
    total, count = 0.0, 0
    for enc in encoded:
        ids = torch.tensor([enc.prompt_ids + enc.answer_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0]
        p = len(enc.prompt_ids)
        # Answer token j (at position p + j) is predicted by the logits at position p + j - 1.
        losses = F.cross_entropy(logits[p - 1 : -1], ids[0, p:], reduction="none")
        total += losses.sum().item()
        count += len(enc.answer_ids)
    assert answer_loss(model, encoded, batch_size=4) == pytest.approx(total / count, rel=1e-5)


def test_example_losses_are_per_row_sums_on_either_head_path(model, tokenizer, monkeypatch):
    encoded = encode_examples(tokenizer, EXAMPLES, max_len=256)
    batch = right_padded_batch(encoded, pad_id=tokenizer.pad_token_id)
    fast = example_losses(model, batch)  # llama: the head on the scored positions only
    monkeypatch.setattr(model.config, "model_type", "not-a-plain-head")
    generic = example_losses(model, batch)  # the model's own forward, full logits
    assert torch.allclose(fast, generic, rtol=1e-5)
    for row, enc in enumerate(encoded):
        alone = example_losses(model, right_padded_batch([enc], pad_id=tokenizer.pad_token_id))
        assert fast[row].item() == pytest.approx(alone.item(), rel=1e-5)
    assert fast.sum().item() / sum(len(e.answer_ids) for e in encoded) == pytest.approx(
        answer_loss(model, encoded, batch_size=2), rel=1e-6)


def test_a_shared_prefix_run_once_gives_the_same_losses(model, tokenizer):
    from zenedge.evaluation import shared_prefix
    from zenedge.runtime.backbone import prefix_states

    encoded = encode_examples(tokenizer, EXAMPLES[:3], max_len=256)  # no system turn: SmolLM2's default one
    skip = shared_prefix(encoded)
    assert skip >= 8 and all(e.prompt_ids[:skip] == encoded[0].prompt_ids[:skip] for e in encoded)
    full = example_losses(model, right_padded_batch(encoded, pad_id=tokenizer.pad_token_id))
    prefix = [prefix_states(model, encoded[0].prompt_ids[:skip])] * len(encoded)
    skipped = example_losses(model, right_padded_batch(encoded, pad_id=tokenizer.pad_token_id, skip=skip), prefix)
    assert torch.allclose(full, skipped, rtol=1e-5)
    with pytest.raises(ValueError, match="skip"):
        right_padded_batch(encoded, pad_id=0, skip=min(len(e.prompt_ids) for e in encoded))


def test_a_peft_wrapped_model_scores_as_its_merged_weights_do(model, tokenizer):
    """PEFT's wrapper has its own `base_model` (the tuner, which gives logits): scoring looks through it."""
    import copy

    from peft import LoraConfig, get_peft_model

    from zenedge.evaluation import shared_prefix
    from zenedge.runtime.backbone import prefix_states

    torch.manual_seed(1)
    wrapped = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                              init_lora_weights=False)).eval()
    encoded = encode_examples(tokenizer, EXAMPLES[:3], max_len=256)
    batch = right_padded_batch(encoded, pad_id=tokenizer.pad_token_id)
    losses = example_losses(wrapped, batch)
    merged = copy.deepcopy(wrapped).merge_and_unload()
    assert torch.allclose(losses, example_losses(merged, batch), rtol=1e-5)
    assert not torch.allclose(losses, example_losses(model, batch), rtol=1e-3)   # the adapter counts
    skip = shared_prefix(encoded)
    prefix = [prefix_states(wrapped, encoded[0].prompt_ids[:skip])] * len(encoded)
    skipped = example_losses(wrapped, right_padded_batch(encoded, pad_id=tokenizer.pad_token_id, skip=skip), prefix)
    assert torch.allclose(losses, skipped, rtol=1e-5)


def test_answer_loss_does_not_depend_on_padding_or_batching(model, tokenizer):
    encoded = encode_examples(tokenizer, EXAMPLES, max_len=256)
    batched = answer_loss(model, encoded, batch_size=4)
    one_by_one = answer_loss(model, encoded, batch_size=1)
    assert batched == pytest.approx(one_by_one, rel=1e-5)


def test_right_padded_batch_marks_exactly_the_answer_predictions(tokenizer):
    encoded = encode_examples(tokenizer, EXAMPLES[:2], max_len=256)
    batch = right_padded_batch(encoded, pad_id=tokenizer.pad_token_id)
    for row, enc in enumerate(encoded):
        scored_targets = batch.input_ids[row, 1:][batch.target_mask[row, :-1]]
        assert scored_targets.tolist() == list(enc.answer_ids)


def test_greedy_completions_same_batched_and_one_by_one(model, tokenizer):
    encoded = encode_examples(tokenizer, EXAMPLES, max_len=256)
    prompts = [e.prompt_ids for e in encoded]
    stop = encoded[0].stop_id
    batched = greedy_completions(model, prompts, 6, stop, pad_id=tokenizer.pad_token_id, batch_size=4)
    single = greedy_completions(model, prompts, 6, stop, pad_id=tokenizer.pad_token_id, batch_size=1)
    assert batched == single
    # And equal to a plain argmax loop on the unpadded sequence.
    seq = list(prompts[0])
    for _ in range(len(batched[0])):
        with torch.no_grad():
            seq.append(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax().item())
    assert seq[len(prompts[0]):] == batched[0]


def _stops_after(model, stop_id: int, lengths_by_prompt: dict[tuple[int, ...], int]):
    """Wrap a model so its greedy choice is `stop_id` once a sequence reaches a set length.

    The length is looked up by the sequence's prompt (its first tokens), so the wrapper works
    whatever order or batching the caller uses.
    """
    def forward(input_ids, attention_mask):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.clone()
        for row, length in enumerate(attention_mask.sum(dim=1).tolist()):
            seq = tuple(input_ids[row, :length].tolist())
            limit = next(n for prompt, n in lengths_by_prompt.items() if seq[: len(prompt)] == prompt)
            if length >= limit:
                logits[row, length - 1, stop_id] = 1e4
        return SimpleNamespace(logits=logits)
    return forward


def _own_greedy_answers(model, tokenizer, examples, n_tokens):
    """(model that stops after its first n greedy tokens, those tokens decoded per example)."""
    prompts = encode_examples(tokenizer, [Example(e.prompt, "x", e.system) for e in examples], 256)
    stop = prompts[0].stop_id
    raw = greedy_completions(model, [p.prompt_ids for p in prompts], n_tokens, stop,
                             pad_id=tokenizer.pad_token_id)
    # The random model rarely stops by itself: force a stop after its n tokens, so that its
    # greedy output is exactly those tokens.
    limits = {p.prompt_ids: len(p.prompt_ids) + len(r) for p, r in zip(prompts, raw)}
    return _stops_after(model, stop, limits), [tokenizer.decode(r, skip_special_tokens=True) for r in raw]


def test_exact_match_is_one_on_own_greedy_outputs_and_zero_on_altered(model, tokenizer):
    wrapped, references = _own_greedy_answers(model, tokenizer, EXAMPLES, 5)
    assert all(ref.strip() for ref in references)
    own = [Example(e.prompt, ref, e.system) for e, ref in zip(EXAMPLES, references)]
    # Re-encoding a decoded answer may not round-trip to the same ids, but exact match compares
    # texts, so it must still be 1.0.
    assert exact_match(wrapped, tokenizer, encode_examples(tokenizer, own, 256), max_new_tokens=8) == 1.0
    altered = [Example(e.prompt, ref + " altered", e.system) for e, ref in zip(EXAMPLES, references)]
    assert exact_match(wrapped, tokenizer, encode_examples(tokenizer, altered, 256), max_new_tokens=8) == 0.0


def test_exact_match_ignores_whitespace_differences(model, tokenizer):
    wrapped, references = _own_greedy_answers(model, tokenizer, EXAMPLES[:2], 4)
    spaced = [Example(e.prompt, "  " + "  ".join(ref.split()) + "\n") for e, ref in zip(EXAMPLES[:2], references)]
    assert exact_match(wrapped, tokenizer, encode_examples(tokenizer, spaced, 256), max_new_tokens=6) == 1.0


def test_load_eval_set_reads_valid_jsonl(tmp_path):
    path = tmp_path / "eval.jsonl"
    rows = [{"prompt": "a", "answer": "b"}, {"prompt": "c", "answer": "d", "system": "s"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert load_eval_set(path) == [Example("a", "b"), Example("c", "d", "s")]


@pytest.mark.parametrize("line, message", [
    ("{not json", "invalid JSON"),
    ('["prompt", "answer"]', "expected a JSON object"),
    ('{"prompt": "a"}', "missing key 'answer'"),
    ('{"prompt": "a", "answer": 3}', "'answer' must be a non-empty string"),
    ('{"prompt": " ", "answer": "b"}', "'prompt' must be a non-empty string"),
    ('{"prompt": "a", "answer": "b", "extra": 1}', "unknown keys"),
])
def test_load_eval_set_names_file_and_line_of_bad_rows(tmp_path, line, message):
    path = tmp_path / "eval.jsonl"
    path.write_text('{"prompt": "ok", "answer": "ok"}\n' + line + "\n")
    with pytest.raises(EvalSetError, match=rf"eval.jsonl:2: .*{message}"):
        load_eval_set(path)


def test_load_eval_set_rejects_missing_and_empty_files(tmp_path):
    with pytest.raises(EvalSetError, match="cannot read"):
        load_eval_set(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(EvalSetError, match="empty"):
        load_eval_set(tmp_path / "empty.jsonl")


def test_committed_profile_eval_sets_are_valid():
    """Every profiles/<name>/eval.jsonl loads and has at least 50 examples."""
    profiles = Path(__file__).resolve().parent.parent / "profiles"
    paths = sorted(profiles.glob("*/eval.jsonl"))
    if not paths:
        pytest.skip("no profile eval sets yet")
    for path in paths:
        examples = load_eval_set(path)
        assert len(examples) >= 50, path
        assert len({e.prompt for e in examples}) == len(examples), f"{path}: duplicate prompts"


REPO = Path(__file__).resolve().parent.parent


def _committed_profiles():
    """The shipped profiles and the held-out benchmark families (profiles/heldout/)."""
    return sorted(p.parent for pattern in ("*/recipe.json", "heldout/*/recipe.json")
                  for p in (REPO / "profiles").glob(pattern))


@pytest.mark.slow
def test_committed_eval_sets_regenerate_and_never_meet_training_prompts():
    """Each eval.jsonl is what its recipe's generator and seed give, disjoint from the train split."""
    if str(REPO) not in sys.path:  # profiles/recipes is run from the repo root, not installed
        sys.path.insert(0, str(REPO))
    from profiles.recipes.data import TASKS, build_splits

    folders = _committed_profiles()
    if not folders:
        pytest.skip("no profiles yet")
    for folder in folders:
        recipe = json.loads((folder / "recipe.json").read_text())
        params = recipe["recipe"]
        train, eval_set = build_splits(TASKS[recipe["name"]], 4000, params["eval_examples"], params["seed"])
        committed = [json.loads(line) for line in (folder / "eval.jsonl").read_text().splitlines()]
        assert committed == eval_set, folder.name
        assert not {e["prompt"] for e in train} & {e["prompt"] for e in committed}, folder.name


@pytest.mark.slow
def test_committed_lora_adapters_load_with_peft_in_bf16(real_base_dir):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    folders = [f for f in _committed_profiles() if (f / "adapter" / "adapter_config.json").exists()]
    if not folders:
        pytest.skip("no LoRA adapters yet")
    # A random model with the base's attention shapes (the LoRA targets); vocabulary and MLP
    # shrunk so that building it is instant. Loading must place every saved tensor.
    base_config = LlamaConfig.from_pretrained(real_base_dir)
    base_config.vocab_size, base_config.intermediate_size = 32, 8
    for folder in folders:
        config = json.loads((folder / "adapter" / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == "smollm2-135m"
        tensors = load_file(folder / "adapter" / "adapter_model.safetensors")
        assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
        assert any(name.endswith("lora_B.weight") and t.abs().max() > 0 for name, t in tensors.items())
        torch.manual_seed(0)
        model = PeftModel.from_pretrained(LlamaForCausalLM(base_config), folder / "adapter")
        loaded = {n: p for n, p in model.named_parameters() if "lora_" in n}
        assert len(loaded) == len(tensors), folder.name
        for name, saved in tensors.items():
            key = name.replace(".weight", ".default.weight")
            assert torch.equal(loaded[key].to(torch.bfloat16), saved), (folder.name, name)


def test_exact_match_counts_each_example_on_a_mixed_set(model, tokenizer):
    wrapped, references = _own_greedy_answers(model, tokenizer, EXAMPLES, 5)
    # Two right, one wrong in its last character, one wrong from the first character.
    answers = [references[0], references[1], references[2][:-1] + "#", "# " + references[3]]
    mixed = [Example(e.prompt, a, e.system) for e, a in zip(EXAMPLES, answers)]
    assert exact_match(wrapped, tokenizer, encode_examples(tokenizer, mixed, 256), max_new_tokens=8) == 0.5


def test_rows_with_their_own_prefixes_read_as_their_whole_texts(model):
    """Per-row prefixes (rows of different variants have different ones) give each row's hidden
    states as reading its prefix and text whole; the read-only cache keeps none of the rows' keys."""
    from zenedge.runtime.backbone import _prefix_cache, cache_argument, hidden_states, prefix_states

    torch.manual_seed(0)
    starts = torch.randint(5, 100, (2, 6)).tolist()
    rest = torch.randint(5, 100, (2, 4))
    prefix = [prefix_states(model, start) for start in starts]
    with torch.no_grad():
        read = hidden_states(model, rest, torch.ones_like(rest), prefix)
        for row, start in enumerate(starts):
            whole = torch.tensor([start + rest[row].tolist()])
            assert torch.allclose(read[row], hidden_states(model, whole, torch.ones_like(whole))[0, 6:], atol=1e-5)
        cache = _prefix_cache(prefix)
        model.model(input_ids=rest, attention_mask=torch.ones(2, 10, dtype=torch.long), use_cache=False,
                    **{cache_argument(model.model): cache})
    assert cache.get_seq_length() == 6
    with pytest.raises(ValueError, match="2 rows"):
        hidden_states(model, rest[:1], torch.ones_like(rest[:1]), prefix)
