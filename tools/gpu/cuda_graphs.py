"""GPU ONLY: the CUDA-graphed decode step checked against eager stepping and the reference loop,
and timed beside them. `python -m tools.gpu.cuda_graphs [--json PATH]` on a CUDA machine.

Self-contained: random llama models (a tiny one for exactness, one shaped like SmolLM2-135M for
speed), LoRA and BitDelta variants built in memory, a stand-in tokenizer. Nothing is downloaded
and no store is needed, so it runs on a bare GPU box with torch + transformers + triton.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

SMOLLM2_SHAPE = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                     num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True)
TINY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256, max_position_embeddings=512, tie_word_embeddings=True)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


class IdsTokenizer:
    """Enough of a tokenizer for generate(): ids in, a readable string out."""

    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def random_resident(shape: dict, dtype: torch.dtype, device: torch.device, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    from zenedge.runtime.transforms import patch_model
    from zenedge.runtime.model import ResidentModel

    torch.manual_seed(seed)
    config = LlamaConfig(**shape)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval().requires_grad_(False)
    state = patch_model(model, device)
    # eos -1: never stops early, so every run decodes exactly max_tokens
    return ResidentModel("random", model, IdsTokenizer(), state, device, dtype, 0.0, (-1,))


def lora_variant(resident, key: str, rank: int = 8, seed: int = 1):
    from zenedge.merge.factors import LoraFactors
    from zenedge.runtime.variants import Variant

    g = torch.Generator().manual_seed(seed)
    modules = {}
    for name in resident.state.modules:
        if name.rsplit(".", 1)[-1] in LORA_TARGETS:
            weight = resident.model.get_submodule(name).base.weight
            out_f, in_f = weight.shape
            a = torch.randn(rank, in_f, generator=g) / in_f ** 0.5
            b = torch.randn(out_f, rank, generator=g) * 0.02
            modules[name] = LoraFactors(a.to(weight), b.to(weight), 2.0)
    return Variant(key, "lora", modules, sum(f.A.numel() + f.B.numel() for f in modules.values()) * 2)


def bitdelta_variant(resident, key: str, seed: int = 2):
    from zenedge.bitdelta.packing import pack_signs
    from zenedge.runtime.variants import BitDeltaModule, Variant

    g = torch.Generator().manual_seed(seed)
    modules = {}
    for name in resident.state.modules:
        weight = resident.model.get_submodule(name).base.weight
        delta = torch.randn(weight.shape, generator=g)
        packed = pack_signs(delta).to(weight.device).contiguous()
        alpha = torch.full((weight.shape[0],), 0.002, dtype=torch.float32, device=weight.device)
        modules[name] = BitDeltaModule(packed, alpha, weight.shape[1])
    return Variant(key, "bitdelta", modules, sum(m.packed.numel() for m in modules.values()))


def requests(rows, lengths, max_tokens, vocab, seed=3):
    from zenedge.runtime.generate import GenerationRequest, SamplingParams

    g = torch.Generator().manual_seed(seed)
    return [GenerationRequest(torch.randint(3, vocab, (n,), generator=g).tolist(), v, SamplingParams(max_tokens=max_tokens))
            for v, n in zip(rows, lengths)]


def tokens(resident, reqs, kind):
    from zenedge.runtime.generate import generate

    out = {i: [] for i in range(len(reqs))}
    for deltas in generate(resident, reqs, stepper=kind):
        for d in deltas:
            out[d.index].append(d.token_id)
    return [out[i] for i in range(len(reqs))]


def agreement(a, b) -> float:
    """Fraction of tokens identical up to each row's first divergence."""
    same = total = 0
    for x, y in zip(a, b):
        n = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        same, total = same + n, total + max(len(x), len(y))
    return same / max(total, 1)


def exactness(device) -> dict:
    """Tiny fp32 model: graphed == fixed-shape eager (same kernels), and vs the reference."""
    resident = random_resident(TINY_SHAPE, torch.float32, device)
    lora, bd, bd2 = lora_variant(resident, "l"), bitdelta_variant(resident, "b"), bitdelta_variant(resident, "b2", 5)
    cases = {"base": [None, None], "lora": [lora], "bitdelta": [bd], "mixed": [lora, None, bd, bd2]}
    report = {}
    for name, rows in cases.items():
        reqs = requests(rows, [5, 9, 3, 12][:len(rows)], 24, TINY_SHAPE["vocab_size"])
        got = {kind: tokens(resident, reqs, kind) for kind in ("dynamic", "static", "fixed", "graphed")}
        report[name] = {"graphed==fixed": got["graphed"] == got["fixed"],
                        "graphed_vs_dynamic": agreement(got["graphed"], got["dynamic"]),
                        "static_vs_dynamic": agreement(got["static"], got["dynamic"])}
    return report


def speed(device, dtype, max_tokens=64, repeats=3) -> dict:
    resident = random_resident(SMOLLM2_SHAPE, dtype, device)
    lora, bd, bd2 = lora_variant(resident, "l"), bitdelta_variant(resident, "b"), bitdelta_variant(resident, "b2", 5)
    vocab = SMOLLM2_SHAPE["vocab_size"]
    cases = {"base": [None], "lora": [lora], "bitdelta": [bd], "mixed4": [None, lora, bd, bd2]}
    report = {}
    for name, rows in cases.items():
        reqs = requests(rows, [40, 33, 47, 20][:len(rows)], max_tokens, vocab)
        row = {}
        for kind in ("dynamic", "static", "graphed"):
            tokens(resident, reqs, kind)                          # warm-up (autotune, allocator)
            times = []
            for _ in range(repeats):
                torch.cuda.synchronize()
                start = time.perf_counter()
                tokens(resident, reqs, kind)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            row[kind] = {"ms_per_step": 1e3 * statistics.median(times) / max_tokens,
                         "tokens_per_s": len(rows) * max_tokens / statistics.median(times)}
        report[name] = row
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this check is GPU-only")
        return 0
    device = torch.device("cuda")
    import transformers

    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__}
    for name, run in (("exactness", lambda: exactness(device)),
                      ("speed_bf16", lambda: speed(device, torch.bfloat16, args.tokens))):
        try:
            result[name] = run()
        except Exception:                      # report and go on: one failure must not hide the rest
            import traceback

            result[name] = {"error": traceback.format_exc()}
        print(name, json.dumps(result[name], indent=1), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
