#!/usr/bin/env bash
# One device run: versions, correctness of every kernel config against the float64 reference,
# then the full benchmark. Run from the repository root on a CUDA machine:
#   OUT=/some/dir bash tools/gpu/gpu_check.sh
# Uses the machine's own torch/triton; installs nothing. The package is put on sys.path through
# a symlink shim (kernels/ is zenedge.kernels only once installed), beside tools/.
set -u -o pipefail
OUT=${OUT:-/tmp/zenedge-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
unset TRITON_INTERPRET

SHIM=$(mktemp -d)
mkdir -p "$SHIM/zenedge"
for entry in "$PWD"/zenedge/*; do ln -s "$entry" "$SHIM/zenedge/"; done   # the package as installed:
ln -s "$PWD/kernels" "$SHIM/zenedge/kernels"                              # zenedge/ plus kernels/
ln -s "$PWD/tools" "$SHIM/tools"
export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
cd "$SHIM"     # python puts the cwd first on sys.path: the repo's own zenedge/ would shadow the shim

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/versions.txt"

# Quick first: one shape proves the whole path (compile, check, graphs) before the long table.
python3 - <<'EOF' 2>&1 | tee "$OUT/smoke.txt"
import torch
from zenedge.kernels.bitdelta import reference
from zenedge.kernels.bitdelta.triton import bitdelta_linear
from zenedge.bitdelta.packing import compress
from zenedge.kernels.bitdelta.configs import DECODE_CONFIGS, PREFILL_CONFIGS
x = torch.randn(3, 512, device="cuda", dtype=torch.bfloat16)
w = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16) * 0.05
p, a = compress(torch.randn(256, 512, device="cuda") * 0.01)
y = bitdelta_linear(x, w, p, a, config=DECODE_CONFIGS[0])    # one compile each, no autotune
r = reference.bitdelta_linear(x.double(), w.double(), p, a.double())
print("smoke decode rel.err", float((y.double() - r).norm() / r.norm()))
x = torch.randn(300, 512, device="cuda", dtype=torch.bfloat16)
y = bitdelta_linear(x, w, p, a, config=PREFILL_CONFIGS[0])
r = reference.bitdelta_linear(x.double(), w.double(), p, a.double())
print("smoke prefill rel.err", float((y.double() - r).norm() / r.norm()))
EOF
echo "smoke done after ${SECONDS}s"

python3 -m tools.gpu.bitdelta_kernels --check 2>&1 | tee "$OUT/bench.txt"
status=$?
echo "bench done after ${SECONDS}s (status $status)" | tee -a "$OUT/bench.txt"
rm -rf "$SHIM"
exit $status
