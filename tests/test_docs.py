"""Every command is documented in the README, and `doctor` reports on a real setup."""

import json
import re

from tests.conftest import REPO, run_cli
from zenedge.cli import app


def test_every_command_is_in_the_readme():
    readme = (REPO / "README.md").read_text()
    missing = [name for name in app.commands if not re.search(rf"`zenedge {re.escape(name)}\b", readme)]
    assert missing == [], f"commands missing from README.md: {missing}"


def test_every_command_has_help_text():
    for name, command in app.commands.items():
        assert (command.help or "").strip(), f"`zenedge {name}` has no help text"


def test_doctor_reports_checks_and_fails_on_a_broken_config(isolated_home, tmp_path):
    result = run_cli("doctor", "--json")
    checks = {c["check"]: c["status"] for c in json.loads(result.stdout)}
    assert checks["python"] == "ok" and checks["config"] == "ok" and "torch" in checks
    runtime = next(c for c in json.loads(result.stdout) if c["check"] == "runtime")
    assert runtime["status"] == "ok" and "weights" in runtime["detail"]
    config = tmp_path / "config" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("[pool]\nbudget = 'lots'\n")
    broken = run_cli("doctor", "--json")
    assert broken.returncode == 1
    assert {c["check"]: c["status"] for c in json.loads(broken.stdout)}["config"] == "fail"


def test_doctor_reports_each_stored_base_decode_path(store):
    """Without a daemon, doctor reads each base's model classes (not its weights) and says which
    stepper, forward and weights its requests would decode with here."""
    store.close()
    result = run_cli("doctor", "--json", env={"ZENEDGE_NATIVE_KERNELS": "0"})
    path = next(c for c in json.loads(result.stdout) if c["check"] == "decode path (tiny)")
    assert path["detail"].startswith("static stepper, lean forward, ") and "weights" in path["detail"]
    assert "native kernels off (ZENEDGE_NATIVE_KERNELS=0)" in path["detail"] and path["status"] == "warn"


def test_doctor_names_what_is_outside_the_tested_lock(tmp_path):
    from importlib.metadata import version

    from zenedge.cli.doctor_cmds import LOCK, _against_the_lock

    assert LOCK == REPO / "constraints.txt"   # the README installs from it
    lock = tmp_path / "constraints.txt"
    lock.write_text(f"# a lock\nclick=={version('click')}\npsutil==0.0.1\nnot-a-real-distribution==1.0\n")
    status, detail = _against_the_lock(lock)
    assert status == "warn"
    assert f"1 of 2 outside the tested lock {lock}: psutil {version('psutil')} (tested: 0.0.1)" in detail
    lock.write_text(f"click=={version('click')}\n")
    assert _against_the_lock(lock) == ("ok", f"all 1 installed packages as in {lock}")
    assert _against_the_lock(tmp_path / "absent.txt")[0] == "ok"


def test_the_lock_pins_every_declared_dependency_but_torch():
    """The README installs with `-c constraints.txt`: each dependency of pyproject.toml (and the test
    extra) is pinned there, except torch, which the README's first step installs itself."""
    import re
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].lower()
                for spec in [*project["dependencies"], *project["optional-dependencies"]["test"]]}
    pinned = {line.split("==")[0].strip().lower().replace("_", "-") for line in
              (REPO / "constraints.txt").read_text().splitlines() if "==" in line and not line.startswith("#")}
    assert declared - pinned == {"torch"}
