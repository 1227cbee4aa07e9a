"""GPU tooling for the BitDelta Triton kernels and the CUDA decode path (BENCHMARKS.md, kernels/RESULTS.md):

- `python -m tools.gpu.bitdelta_kernels [--sass | --check | --quick]`: the kernels' timing tables
  (on CUDA; without it, the torch CPU path's table).
- `tools.gpu.bitdelta_baselines`: the published BitDelta kernel design and the naive path, as baselines.
- `tools.gpu.sass`: every config compiled for sm_90a without a GPU, its SASS read.
- `tools.gpu.gpu_check`: compile every config in parallel and check each on the GPU.
- `OUT=DIR bash tools/gpu/gpu_check.sh`: one device run (versions, checks, the full table).
- `python -m tools.gpu.cuda_graphs`: the CUDA-graphed decode step, checked and timed.
"""
