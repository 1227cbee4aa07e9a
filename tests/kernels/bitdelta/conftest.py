"""Kernel tests run the Triton kernels through the interpreter on CPU tensors (how CI runs them).

TRITON_INTERPRET is read when a @triton.jit function is defined, so it must be set before
zenedge.kernels.bitdelta.fused_kernel is first imported in this process: this conftest is imported at
collection, before any test module here imports the kernels.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")    # silence triton 3.9's default-change warning
