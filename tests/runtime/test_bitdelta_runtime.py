"""BitDelta variants end to end: compress a real fine-tune, import it, serve it per row."""

import pytest
import torch

from zenedge import pool
from zenedge.bitdelta import compress_model, decompress, load_bitdelta
from zenedge.errors import InvalidAdapter


def fine_tune_copy(tiny_base_dir, path, seed=0, touch_norm=False):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(tiny_base_dir)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 2 and "layers." in name:
                param.add_(0.02 * torch.randn_like(param))
            if touch_norm and name.endswith("input_layernorm.weight"):
                param.mul_(1.1)
    model.save_pretrained(path)
    return path


@pytest.fixture
def delta_file(tmp_path, tiny_base_dir, store):
    def make(seed=0, touch_norm=False):
        ft = fine_tune_copy(tiny_base_dir, tmp_path / f"ft-{seed}-{touch_norm}", seed, touch_norm)
        out = tmp_path / f"delta-{seed}-{touch_norm}.bitdelta"
        compress_model(tiny_base_dir, ft, out, base_sha256=store.base("tiny")["sha256"])
        return out

    return make


def dense_reference(tiny_base_dir, path):
    """The fine-tune as BitDelta promises it: W_base + α⊙sign(Δ), materialised."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_base_dir).eval()
    data = load_bitdelta(path)
    with torch.no_grad():
        for module, (packed, alpha, in_features) in data.modules.items():
            model.get_submodule(module).weight.add_(decompress(packed, alpha, in_features))
    return model


def test_bitdelta_logits_equal_the_dense_reconstruction(engine, store, cfg, delta_file, tiny_base_dir):
    path = delta_file()
    pool.import_bitdelta(store, cfg, path, "delta", base="tiny")
    assert store.resolve("delta")["kind"] == "bitdelta"
    input_ids = torch.randint(3, 99, (2, 11))
    route = engine.router.route("delta")
    resident = engine.resident("tiny")
    # the plain weights, as a prefill reads them (a decode step adds the same delta to the base's
    # int4 copy through the sign kernel: tests/kernels/native/test_native.py, test_decode_step.py)
    with torch.inference_mode(), resident.state.using([engine.variant(route)] * 2, plain=True):
        ours = resident.model(input_ids=input_ids).logits
    with torch.no_grad():
        expected = dense_reference(tiny_base_dir, path)(input_ids=input_ids).logits
    assert (ours - expected).abs().max() < 1e-4


def test_mixed_batch_of_base_lora_and_bitdelta_rows(engine, store, cfg, delta_file, imported):
    pool.import_bitdelta(store, cfg, delta_file(1), "d1", base="tiny")
    pool.import_bitdelta(store, cfg, delta_file(2), "d2", base="tiny")
    imported("lora", seed=3)
    resident = engine.resident("tiny")
    rows = [engine.variant(engine.router.route(n)) if n else None for n in ("d1", "lora", None, "d2", "d1")]
    input_ids = torch.randint(3, 99, (5, 7))
    with torch.inference_mode():
        with resident.state.using(rows):
            mixed = resident.model(input_ids=input_ids).logits
        for i, variant in enumerate(rows):
            with resident.state.using([variant]):
                alone = resident.model(input_ids=input_ids[i:i + 1]).logits
            assert (mixed[i] - alone[0]).abs().max() < 1e-4


def test_a_delta_that_changes_norms_is_refused(store, cfg, delta_file):
    with pytest.raises(InvalidAdapter, match="non-projection"):
        pool.import_bitdelta(store, cfg, delta_file(touch_norm=True), "normy", base="tiny")
    assert store.names() == []


def test_a_delta_for_another_base_is_refused(store, cfg, tmp_path, tiny_base_dir):
    ft = fine_tune_copy(tiny_base_dir, tmp_path / "ft")
    out = tmp_path / "other.bitdelta"
    compress_model(tiny_base_dir, ft, out, base_sha256="f" * 64)
    with pytest.raises(InvalidAdapter, match="different base"):
        pool.import_bitdelta(store, cfg, out, "other", base="tiny")


def test_a_file_that_is_not_a_bitdelta_is_refused(store, cfg, lora_factory):
    with pytest.raises(InvalidAdapter):
        pool.import_bitdelta(store, cfg, lora_factory() / "adapter_model.safetensors", "x", base="tiny")


def test_compress_cli_stores_a_servable_variant(store, tmp_path, tiny_base_dir):
    from tests.conftest import run_cli

    ft = fine_tune_copy(tiny_base_dir, tmp_path / "ft-cli")
    result = run_cli("compress", "--base", "tiny", "--finetuned", str(ft), "--name", "full", "--json", check=True)
    import json

    summary = json.loads(result.stdout)
    assert summary["kind"] == "bitdelta" and summary["ratio"] > 4
    assert summary["modules"] == 2 * 7
    listed = json.loads(run_cli("list", "--json", check=True).stdout)
    assert [(e["name"], e["kind"]) for e in listed] == [("full", "bitdelta")]
    out = run_cli("run", "full", "hello", "--max-tokens", "3", "--json", check=True)
    assert json.loads(out.stdout)["completion_tokens"] >= 1


def test_on_the_cpu_the_signs_are_kept_by_input_byte_and_the_sign_kernel_reads_them_in_place(delta_file):
    """runtime.variants.load_bitdelta keeps each module's bytes as [in/8, out] (sign_add.c's order),
    seen as the file's [out, in/8]: the same values, no second copy for the C kernel."""
    from zenedge.kernels import native
    from zenedge.runtime.variants import load_bitdelta as load_variant

    path = delta_file()
    variant = load_variant("d", path, torch.device("cpu"))
    stored = load_bitdelta(path).modules
    for name, module in variant.modules.items():
        assert torch.equal(module.packed, stored[name][0]) and module.packed.t().is_contiguous()
        assert module.packed.t().contiguous().data_ptr() == module.packed.data_ptr()   # no copy to hand it over
    if native.library() is not None:
        module = next(iter(variant.modules.values()))
        kernel = native.sign_add_fn(module.packed, module.alpha, module.in_features)
        x, y = torch.randn(2, module.in_features), torch.zeros(2, module.alpha.shape[0])
        signs = decompress(module.packed.contiguous(), torch.ones_like(module.alpha), module.in_features)
        want = (native.rounded(x, 8) @ signs.t()) * module.alpha
        torch.testing.assert_close(kernel(y, x), want, rtol=1e-5, atol=1e-6)
