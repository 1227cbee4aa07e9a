import json

import pytest

from zenedge import config, paths
from zenedge.errors import ConfigError
from tests.conftest import run_cli


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_missing_file_means_defaults(tmp_path):
    cfg = config.load(tmp_path / "nope.toml")
    assert cfg.budget == 4 * 2**30
    assert cfg.pool.max_adapters == 8
    assert cfg.registry.urls == ("embedded",)


def test_values_are_parsed(tmp_path):
    path = write(tmp_path / "c.toml", '[pool]\nbudget = "500MB"\nmerge_rank = 16\n[runtime]\npinned = ["writer"]\n')
    cfg = config.load(path)
    assert cfg.budget == 500 * 10**6
    assert cfg.pool.merge_rank == 16
    assert cfg.runtime.pinned == ("writer",)


def test_settings_are_typed_frozen_and_say_what_changed(tmp_path):
    path = write(tmp_path / "c.toml", '[pool]\nbudget = "500MB"\n')
    before = config.load(path)
    assert isinstance(before.pool, config.PoolSettings) and isinstance(before.server, config.ServerSettings)
    with pytest.raises(AttributeError):
        before.pool.budget = 1  # the config in force is never changed in place; a reload replaces it
    write(path, '[pool]\nbudget = "600MB"\n[runtime]\npinned = ["writer"]\n[server]\nmax_queue = 3\n')
    assert config.load(path).changes(before) == ["pool.budget", "runtime.pinned", "server.max_queue"]
    assert before.changes(before) == []


def test_the_schema_is_the_settings_fields():
    for section, settings in config.SECTIONS.items():
        defaults = settings()
        for key, spec in config.SCHEMA[section].items():
            assert getattr(defaults, key) == spec.parse(spec.default) and spec.doc


@pytest.mark.parametrize("text,fragment", [
    ("[pool\nbudget = 1", "invalid TOML"),
    ('[pool]\nbudgte = "1GB"\n', "c.toml:2: pool.budgte: unknown key (did you mean budget?)"),
    ('[pool]\nbudget = "lots"\n', "c.toml:2: pool.budget: invalid size 'lots'"),
    ('[pool]\n\nquality_threshold = 3\n', "c.toml:3: pool.quality_threshold"),
    ('[runtim]\ndevice = "cpu"\n', "unknown section (did you mean [runtime]?)"),
    ('[server]\ntcp = "localhost"\n', "HOST:PORT"),
])
def test_broken_config_names_file_line_and_key(tmp_path, text, fragment):
    path = write(tmp_path / "c.toml", text)
    with pytest.raises(ConfigError) as info:
        config.load(path)
    assert fragment in str(info.value)


def test_set_value_keeps_comments_and_other_keys(tmp_path):
    path = write(tmp_path / "c.toml", '# my settings\n[pool]\nbudget = "1GB"  # small laptop\nmax_adapters = 3\n')
    config.set_value("pool", "budget", "2GB", path)
    text = path.read_text()
    assert "# my settings" in text and "max_adapters = 3" in text
    assert config.load(path).budget == 2 * 10**9


def test_cli_refuses_broken_config_and_changes_nothing(tmp_path):
    cfg_path = tmp_path / "config" / "config.toml"
    original = '[pool]\nbudget = "1GB"\nmax_adaptors = 3\n'
    write(cfg_path, original)
    result = run_cli("budget", "set", "2GB")
    assert result.returncode == 2
    assert "config.toml:3: pool.max_adaptors: unknown key (did you mean max_adapters?)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert cfg_path.read_text() == original


def test_cli_budget_set_rejects_bad_size(tmp_path):
    result = run_cli("budget", "set", "a lot")
    assert result.returncode == 2
    assert "invalid size" in result.stderr


def test_two_homes_never_share_a_default_socket_dir(tmp_path, monkeypatch):
    from zenedge import paths

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("ZENEDGE_HOME", str(tmp_path / "a"))
    first = paths.runtime_dir()
    monkeypatch.setenv("ZENEDGE_HOME", str(tmp_path / "b"))
    assert paths.runtime_dir() != first and first.parent == tmp_path / "zenedge"
    monkeypatch.delenv("ZENEDGE_HOME")
    assert paths.runtime_dir() == tmp_path / "zenedge"


@pytest.mark.parametrize("value", ["1.5", "0.5B", 1.5, "0", 0, "0GB"])
def test_a_budget_of_fractional_or_zero_bytes_is_refused(tmp_path, value):
    """Regression: `budget = 1.5` became 2 bytes; 0.5B became 0, which evicts every adapter."""
    path = tmp_path / "config.toml"
    path.write_text(f"[pool]\nbudget = {json.dumps(value)}\n")
    with pytest.raises(ConfigError, match=r"config.toml:2: pool.budget"):
        config.load(path)


def test_budget_set_refuses_zero_before_evicting_anything(isolated_home, tiny_base_dir, lora_factory):
    from tests.conftest import run_cli
    from zenedge import bases
    from zenedge.store import Store

    bases.add_hf_dir(Store(isolated_home), tiny_base_dir, "tiny")
    run_cli("import", str(lora_factory(seed=1)), "--name", "writer", "--base", "tiny", check=True)
    for size in ("0", "0.5B", "0GiB"):
        result = run_cli("budget", "set", size)
        assert result.returncode == 2 and result.stderr.startswith("error: "), result.stderr
    assert [n["name"] for n in Store(isolated_home).names()] == ["writer"]


def test_the_runtime_directory_is_private(tmp_path, monkeypatch):
    """Regression: $XDG_RUNTIME_DIR/zenedge was created 0755 (the socket names inside were listable)."""
    import stat

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("ZENEDGE_HOME")
    made = paths.runtime_dir()
    assert made == tmp_path / "zenedge" and stat.S_IMODE(made.stat().st_mode) == 0o700
    made.chmod(0o755)  # made by an older version: tightened
    assert stat.S_IMODE(paths.runtime_dir().stat().st_mode) == 0o700
    monkeypatch.setenv("ZENEDGE_HOME", str(tmp_path / "elsewhere"))
    nested = paths.runtime_dir()
    assert nested.parent == tmp_path / "zenedge"
    for directory in (nested, nested.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700


@pytest.mark.parametrize("value", ["nan", "inf", "-1.0", "0.5", "1e12"])
def test_keep_alive_is_zero_or_a_finite_span_of_at_least_a_second(tmp_path, value):
    path = tmp_path / "config.toml"
    path.write_text(f"[server]\nkeep_alive = {value}\n")
    with pytest.raises(ConfigError, match="server.keep_alive"):
        config.load(path)


def test_a_scratch_environment_points_every_location_into_its_root(tmp_path, monkeypatch):
    import stat
    from pathlib import Path

    monkeypatch.setenv("ZENEDGE_HOME", "/the/users/pool")
    env = paths.scratch_environment(tmp_path, '[runtime]\ndevice = "cpu"\n')
    assert env["ZENEDGE_HOME"] == f"{tmp_path}/home" and env["ZENEDGE_KEEP_ALIVE"] == "0"
    assert config.load(Path(env["ZENEDGE_CONFIG"])).runtime.device == "cpu"
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o700 and env["XDG_RUNTIME_DIR"] == f"{tmp_path}/run"
