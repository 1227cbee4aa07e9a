"""A tiny llama GGUF written with gguf-py, for tests: the embedded base's tokenizer (its metadata
copied), random weights in a mix of tensor types (Q4_0, Q4_1, Q4_K, Q8_0, Q6_K, F16, F32), an
untied head, grouped-query attention. Q4_0, Q4_1 and Q8_0 blocks come from gguf-py's quantizer;
Q4_K and Q6_K (which gguf-py does not quantize) are random blocks with small fp16 scales, which
every reader must decode the same way. A reader undoes llama.cpp's q/k row permutation (`permute`)
on q and k, as transformers' GGUF loader does."""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 256, 2, 4, 2, 512

# GGUF name (per layer where it holds {i}) -> (rows, inputs, type)
TENSORS = {
    "blk.{i}.attn_q.weight": (HIDDEN, HIDDEN, "Q4_K"),
    "blk.{i}.attn_k.weight": (HIDDEN * KV_HEADS // HEADS, HIDDEN, "Q4_0"),
    "blk.{i}.attn_v.weight": (HIDDEN * KV_HEADS // HEADS, HIDDEN, "Q6_K"),
    "blk.{i}.attn_output.weight": (HIDDEN, HIDDEN, "Q8_0"),
    "blk.{i}.ffn_gate.weight": (FFN, HIDDEN, "Q4_1"),
    "blk.{i}.ffn_up.weight": (FFN, HIDDEN, "Q4_K"),
    "blk.{i}.ffn_down.weight": (HIDDEN, FFN, "Q4_0"),
}
# (block bytes, where its fp16 scales sit) for the random blocks
RANDOM_BLOCKS = {"Q4_K": (144, (0, 2)), "Q6_K": (210, (208,))}


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to a llama q/k projection's rows."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def write(path: Path, source: Path, seed: int = 0) -> Path:
    """Write the tiny GGUF to `path`, its tokenizer from the GGUF at `source`."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    src = gguf.GGUFReader(source)
    vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    writer = gguf.GGUFWriter(str(path), "llama")
    for name, field in src.fields.items():
        if name.startswith("tokenizer."):
            sub = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
    writer.add_block_count(LAYERS)
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)

    def add(name, rows, inputs, kind):
        if kind in RANDOM_BLOCKS:
            size, scales = RANDOM_BLOCKS[kind]
            raw = rng.integers(0, 256, (rows, inputs // 256, size), dtype=np.uint8)
            for at in scales:
                d = (rng.random((rows, inputs // 256)) * 2e-3 + 1e-4).astype(np.float16)
                raw[..., at:at + 2] = d.view(np.uint8).reshape(rows, inputs // 256, 2)
            writer.add_tensor(name, raw.reshape(rows, -1), raw_dtype=gguf.GGMLQuantizationType[kind])
            return
        weights = (rng.standard_normal((rows, inputs)) * 0.05).astype(np.float32)
        if kind == "F32":
            writer.add_tensor(name, weights)
        elif kind == "F16":
            writer.add_tensor(name, weights.astype(np.float16))
        else:
            qtype = gguf.GGMLQuantizationType[kind]
            writer.add_tensor(name, quantize(weights, qtype), raw_dtype=qtype)

    add("token_embd.weight", vocab, HIDDEN, "F16")
    for i in range(LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
        for pattern, (rows, inputs, kind) in TENSORS.items():
            add(pattern.format(i=i), rows, inputs, kind)
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    add("output.weight", vocab, HIDDEN, "Q8_0")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
