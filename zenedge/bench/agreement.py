"""`zenedge bench dtypes`: do bf16, int8 and int4 weights keep fp32's output on this base?

Greedy decoding of short, varied, chat-templated prompts with the same base in fp32 and in each
other precision (bench.throughput.precisions), one prompt at a time (no padding, so only the
precision differs). Reported per precision: the fraction of tokens identical up to each prompt's
first divergence, the fraction of prompts fully identical, the time of all prompts in the same
run, and, since a diverging greedy path is not by itself a worse one, the base's teacher-forced
answer loss on the embedded profiles' eval sets.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

PROMPTS = [
    "What is the capital of France?", "Give me three tips for better sleep.", "Explain photosynthesis simply.",
    "Write a haiku about autumn.", "What is 17 times 23?", "Translate 'good morning' into Spanish.",
    "Name five animals that live in the ocean.", "How do I boil an egg?", "What causes rain?",
    "Summarise the plot of Cinderella in two sentences.", "Write a Python function that reverses a string.",
    "What is the difference between weather and climate?", "Suggest a name for a pet goldfish.",
    "Why is the sky blue?", "List the planets of the solar system.", "How many days are in a leap year?",
    "Write a short thank-you note to a teacher.", "What does a CPU do?", "Give an example of a metaphor.",
    "How do vaccines work?", "What is the boiling point of water in Fahrenheit?", "Describe a cat to a child.",
    "Write one sentence using the word 'serendipity'.", "What is a prime number?", "How do bees make honey?",
    "Recommend a book for a long train ride.", "What is the tallest mountain on Earth?",
    "Explain what an API is in one paragraph.", "Write a limerick about a frog.", "What is gravity?",
    "How can I save money on groceries?", "What language is spoken in Brazil?", "Define 'democracy'.",
    "Give me a fun fact about octopuses.", "What is the square root of 144?", "How does a rainbow form?",
    "Write a two-line poem about coffee.", "What are the primary colours?", "Why do leaves change colour?",
    "Explain recursion to a beginner.", "What should I pack for a beach holiday?", "Who invented the telephone?",
    "What is the freezing point of water in Celsius?", "Describe the taste of a lemon.",
    "Give me a synonym for 'happy'.", "What is machine learning?", "How do I make a paper airplane?",
    "What is the largest desert in the world?", "Write a motivational quote.", "What does DNA stand for?",
]


EVAL_EXAMPLES = 40   # per eval set: enough for a loss to two decimals, quick on a CPU


def embedded_eval_sets() -> dict[str, Path]:
    """The eval sets shipped with the embedded registry (profiles/*/eval.jsonl), by profile."""
    from importlib.resources import files

    root = Path(str(files("zenedge.profiles")))
    return {path.parent.name: path for path in sorted(root.glob("*/eval.jsonl"))}


def prefix_agreement(a: list[list[int]], b: list[list[int]]) -> dict[str, float]:
    """Token agreement of paired greedy outputs: identical tokens up to each pair's first
    divergence over all tokens (the longer side counts), and the share of identical pairs."""
    if len(a) != len(b):
        raise ValueError("paired outputs differ in count")
    same = total = identical = 0
    for x, y in zip(a, b):
        prefix = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        same += prefix
        total += max(len(x), len(y))
        identical += x == y
    return {"token_agreement": same / total if total else 1.0,
            "identical_prompts": identical / len(a) if a else 1.0}


def run_agreement(base_dir: Path, prompts: int = 50, tokens: int = 32, progress=None,
                  against: tuple[str, ...] = ("bfloat16", "int8", "int4")) -> dict:
    """fp32 and each precision in `against`, one after the other (one resident in memory)."""
    import torch

    from zenedge.bench.throughput import PRECISIONS, precisions
    from zenedge.evaluation import answer_loss, encode_examples, load_eval_set
    from zenedge.runtime.generate import GenerationRequest, SamplingParams, generate
    from zenedge.runtime.prompts import encode_chat
    from zenedge.runtime.model import load_resident

    if not 1 <= prompts <= len(PROMPTS):
        raise ValueError(f"prompts must be between 1 and {len(PROMPTS)}")
    setups = precisions()
    unknown = [label for label in against if label not in setups or label == "float32"]
    if unknown:
        raise ValueError(f"unknown precision {unknown[0]!r}: choose from {', '.join(PRECISIONS[1:])}")
    cpu = torch.device("cpu")
    outputs, seconds, losses = {}, {}, {}
    eval_sets = embedded_eval_sets()
    for label in ("float32", *against):
        dtype, weights = setups[label]
        resident = load_resident("bench", base_dir, cpu, dtype, weights)
        outputs[label], spent = [], 0.0
        for i, text in enumerate(PROMPTS[:prompts]):
            ids = encode_chat(resident.tokenizer, [{"role": "user", "content": text}])
            request = GenerationRequest(ids, None, SamplingParams(max_tokens=tokens))
            start = time.perf_counter()
            tokens_out = [d.token_id for step in generate(resident, [request]) for d in step if d.token_id is not None]
            spent += time.perf_counter() - start
            outputs[label].append(tokens_out)
            if progress and (i + 1) % 10 == 0:
                progress(f"{label}: {i + 1}/{prompts} prompts")
        seconds[label] = spent
        losses[label] = {}
        for set_name, path in eval_sets.items():
            encoded = encode_examples(resident.tokenizer, load_eval_set(path)[:EVAL_EXAMPLES], 512)
            with torch.inference_mode(), resident.state.using([None]):
                losses[label][set_name] = answer_loss(resident.model, encoded, 8, resident.tokenizer.pad_token_id)
        del resident
    return {"prompts": prompts, "tokens": tokens, "eval_examples": EVAL_EXAMPLES,
            "mean_tokens": statistics.mean(len(o) for o in outputs["float32"]),
            "seconds": seconds, "answer_loss": losses,
            "agreement": {label: prefix_agreement(outputs["float32"], outputs[label]) for label in against}}
