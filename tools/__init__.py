"""Tools for working on this repository, not installed with zenedge (pyproject.toml lists the
packages that ship). Run them from the repository root, e.g. `python -m tools.bench_similarity`;
they import zenedge, and zenedge imports nothing from here.

- `tools.gpu`: the BitDelta kernels' GPU tooling (timing tables, SASS, config checks, the
  CUDA-graph check).
- `tools.bench_similarity`: times the pool's merge math on smollm2-shaped adapters.
- `tools.cpu_kernels`: zenedge's C kernels for the CPU against torch's ops, per instruction set.
"""
