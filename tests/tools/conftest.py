"""The BitDelta kernels' benchmark baselines run their Triton kernels through the interpreter on
CPU tensors, as the kernel tests do (tests/kernels/bitdelta/conftest.py says why this is set at
collection, before anything imports a @triton.jit function)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")    # silence triton 3.9's default-change warning
