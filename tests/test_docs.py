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
