"""The CLI as users run it: real subprocesses, real files, JSON contracts, concurrency."""

import json
import subprocess
import sys

from tests.conftest import run_cli, tiny_module_shapes, write_lora_dir
from zenedge import bases
from zenedge.store import Store


def setup_base(home, tiny_base_dir):
    bases.add_hf_dir(Store(home), tiny_base_dir, "tiny")


def test_list_and_budget_json_contracts(isolated_home, tiny_base_dir, lora_factory):
    setup_base(isolated_home, tiny_base_dir)
    run_cli("import", str(lora_factory(seed=3)), "--name", "writer", "--base", "tiny", check=True)
    [entry] = json.loads(run_cli("list", "--json", check=True).stdout)
    assert {"name", "kind", "bytes", "served_by"} <= set(entry)
    assert entry["name"] == "writer" and entry["kind"] == "lora" and entry["bytes"] > 0
    budget = json.loads(run_cli("budget", "show", "--json", check=True).stdout)
    assert budget["used_bytes"] == entry["bytes"]
    assert budget["budget_bytes"] == 4 * 2**30
    assert budget["free_bytes"] == budget["budget_bytes"] - budget["used_bytes"]
    assert budget["bases_bytes"] > 0 and budget["by_kind"] == {"lora": entry["bytes"]}


def test_budget_set_dry_run_then_real(isolated_home, tiny_base_dir, lora_factory, tmp_path):
    setup_base(isolated_home, tiny_base_dir)
    for i, name in enumerate(["a", "b"]):
        run_cli("import", str(lora_factory(seed=i)), "--name", name, "--base", "tiny", check=True)
    size = json.loads(run_cli("list", "--json").stdout)[0]["bytes"]
    dry = json.loads(run_cli("budget", "set", f"{size}B", "--dry-run", "--json", check=True).stdout)
    assert len(dry["evict"]) == 1 and dry["dry_run"]
    assert len(json.loads(run_cli("list", "--json").stdout)) == 2
    real = json.loads(run_cli("budget", "set", f"{size}B", "--json", check=True).stdout)
    assert real["evict"] == dry["evict"]
    assert len(json.loads(run_cli("list", "--json").stdout)) == 1
    assert run_cli("pool", "check").returncode == 0


def test_rm_unknown_name_fails_clearly(isolated_home):
    result = run_cli("rm", "ghost")
    assert result.returncode == 1 and "not in the pool" in result.stderr


def test_concurrent_cli_imports_all_land_within_budget(isolated_home, tiny_base_dir, tmp_path):
    setup_base(isolated_home, tiny_base_dir)
    shapes = tiny_module_shapes(tiny_base_dir)
    dirs = [write_lora_dir(tmp_path / f"c{i}", shapes, seed=100 + i) for i in range(6)]
    procs = [subprocess.Popen([sys.executable, "-m", "zenedge.cli", "import", str(d), "--name", f"p{i}",
                               "--base", "tiny"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, d in enumerate(dirs)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert all(code == 0 for code, _ in results), results
    names = sorted(e["name"] for e in json.loads(run_cli("list", "--json").stdout))
    assert names == [f"p{i}" for i in range(6)]
    assert run_cli("pool", "check").returncode == 0


def test_concurrent_imports_under_a_tight_budget_never_breach_it(isolated_home, tiny_base_dir, tmp_path):
    setup_base(isolated_home, tiny_base_dir)
    shapes = tiny_module_shapes(tiny_base_dir)
    dirs = [write_lora_dir(tmp_path / f"t{i}", shapes, seed=200 + i) for i in range(5)]
    one = (dirs[0] / "adapter_model.safetensors").stat().st_size
    run_cli("budget", "set", f"{2 * one + 10}B", check=True)
    from zenedge import config, paths

    config.set_value("pool", "on_no_merge", "refuse", paths.config_path())
    config.set_value("pool", "store_dtype", "given", paths.config_path())   # two of these files fit, as sized
    config.set_value("pool", "compress_to", "off", paths.config_path())
    procs = [subprocess.Popen([sys.executable, "-m", "zenedge.cli", "import", str(d), "--name", f"t{i}",
                               "--base", "tiny"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, d in enumerate(dirs)]
    codes = [p.wait(timeout=300) for p in procs]
    assert sorted(codes) == [0, 0, 1, 1, 1]
    budget = json.loads(run_cli("budget", "show", "--json").stdout)
    assert budget["used_bytes"] <= budget["budget_bytes"]
    assert run_cli("pool", "check").returncode == 0


def test_version_and_help_answer(isolated_home):
    assert run_cli("--version", check=True).stdout.startswith("zenedge ")
    help_text = run_cli("--help", check=True).stdout
    for command in ("list", "import", "rm", "budget", "pool", "pin", "unpin", "base"):
        assert command in help_text


def test_pool_check_exits_65_when_the_pool_is_inconsistent(isolated_home, tiny_base_dir, lora_factory):
    setup_base(isolated_home, tiny_base_dir)
    run_cli("import", str(lora_factory(seed=5)), "--name", "writer", "--base", "tiny", check=True)
    assert run_cli("pool", "check").returncode == 0
    [blob] = list((isolated_home / "blobs").iterdir())
    blob.unlink()
    result = run_cli("pool", "check")
    assert result.returncode == 65 and "missing blob" in result.stdout   # README: 65 is damaged data


def one_error_line(result, code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_usage_errors_are_one_line_with_exit_2(isolated_home):
    """Regression: click printed usage, a hint and the error on three lines."""
    assert "--bogus" in one_error_line(run_cli("list", "--bogus"), 2)
    assert "NAME" in one_error_line(run_cli("rm"), 2)
    line = one_error_line(run_cli("pool", "nope"), 2)
    assert "nope" in line and "zenedge pool --help" in line
    assert "SIZE" in one_error_line(run_cli("budget", "set"), 2)


def test_an_export_that_cannot_be_written_is_one_line(isolated_home, tiny_base_dir, lora_factory, tmp_path):
    """Regression: `export /proc/zz writer` ended in a FileNotFoundError traceback."""
    setup_base(isolated_home, tiny_base_dir)
    run_cli("import", str(lora_factory(seed=3)), "--name", "writer", "--base", "tiny", check=True)
    assert "/proc/zz" in one_error_line(run_cli("export", "/proc/zz", "writer"), 1)
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    assert str(blocked) in one_error_line(run_cli("export", str(blocked / "out"), "writer"), 1)
    # an unknown name is refused before anything is written
    one_error_line(run_cli("export", str(tmp_path / "fresh"), "ghost"), 1)
    assert not (tmp_path / "fresh").exists()


def test_compress_on_a_mismatched_checkpoint_is_one_line(isolated_home, tiny_base_dir, tmp_path):
    """Regression: BitDelta's errors were ValueErrors that escaped main as tracebacks."""
    setup_base(isolated_home, tiny_base_dir)
    empty = tmp_path / "not-a-checkpoint"
    empty.mkdir()
    line = one_error_line(run_cli("compress", "--base", "tiny", "--finetuned", str(empty), "--name", "x"), 2)
    assert "no .safetensors" in line
    assert Store(isolated_home).names() == []


def test_a_gguf_base_add_cannot_take_is_one_line_and_stores_nothing(isolated_home, tmp_path):
    import gguf
    import numpy as np

    foreign = tmp_path / "foo.gguf"
    writer = gguf.GGUFWriter(str(foreign), "foo")   # an architecture transformers' GGUF loader does not read
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(foreign.read_bytes()[:20])
    for path, says in ((foreign, "foo.gguf (foo) cannot be loaded: GGUF model with architecture foo"),
                       (truncated, "cut.gguf is not a readable GGUF file")):
        result = run_cli("base", "add", str(path))
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr.splitlines()[-1].startswith(f"error: {says}"), result.stderr   # after any progress
    listed = json.loads(run_cli("base", "list", "--json", check=True).stdout)
    assert not any(b["name"] in ("foo", "cut") for b in listed)
