"""The sign kernel's share of a packed BitDelta decode against the int4 product's, under perf:
python -m tools.perf_sign_share (from the repository root, with `perf` installed). Records three
256-token generations of one packed BitDelta row (one thread) and prints the samples of the sign
kernel (sign_add.c: rows_in_blocks, zenedge_sign_rows) and of zenedge_int4_gemm, and their ratio."""
import subprocess
import sys
import tempfile
from pathlib import Path

GENERATE = r'''
import dataclasses, tempfile, torch
from pathlib import Path
from zenedge.bench.throughput import resolve_base, PROMPT
from zenedge.bench.variants import make_bitdelta
from zenedge.runtime import threads
from zenedge.runtime.generate import GenerationRequest, SamplingParams, generate
from zenedge.runtime.model import load_resident
from zenedge.runtime.prompts import encode_chat
from zenedge.runtime.variants import load_bitdelta
threads.configure(1)
cpu = torch.device("cpu")
base_dir, _, _ = resolve_base(None)
work = Path(tempfile.mkdtemp())
delta = load_bitdelta("d", make_bitdelta(base_dir, work, work / "d.bitdelta", seed=10), cpu)
resident = dataclasses.replace(load_resident("b", base_dir, cpu, torch.float32, "int4"), eos_ids=(-1,))
prompt = encode_chat(resident.tokenizer, PROMPT)
for _ in range(3):
    for _ in generate(resident, [GenerationRequest(prompt, delta, SamplingParams(max_tokens=256))]):
        pass
'''


def main() -> None:
    with tempfile.TemporaryDirectory() as work:
        data = Path(work) / "perf.data"
        subprocess.run(["perf", "record", "-q", "-F", "999", "-o", str(data), sys.executable, "-c", GENERATE],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        report = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "symbol", "--stdio"],
                                check=True, capture_output=True, text=True).stdout
    shares = {}
    for line in report.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0].endswith("%") and parts[1] == "[.]":
            shares[parts[2]] = shares.get(parts[2], 0.0) + float(parts[0][:-1])
    sign = shares.get("rows_in_blocks", 0.0) + shares.get("zenedge_sign_rows", 0.0)
    int4 = shares.get("zenedge_int4_gemm", 0.0)
    for name, share in sorted(shares.items(), key=lambda kv: -kv[1])[:6]:
        print(f"{share:6.2f} %  {name}")
    print(f"sign kernel {sign:.2f} %, int4 product {int4:.2f} %: sign / int4 = {sign / int4:.2f}")


if __name__ == "__main__":
    main()
