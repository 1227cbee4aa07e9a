"""zenedge.kernels: the kernels the runtime multiplies with, one room each.

- `zenedge.kernels.bitdelta`: y = x·(W + α⊙S)ᵀ (+b) for 1-bit BitDelta deltas: the fused Triton
  kernels (CUDA), their torch references and the torch path for the CPU.
- `zenedge.kernels.native`: zenedge's C kernels for the CPU (int4 / int8 products, RMSNorm,
  decode attention, LoRA, the whole decode step), compiled on first use.

Their sources live in the repository's top-level kernels/ (kernels/native, kernels/bitdelta),
which pyproject.toml maps here; this package itself lives in zenedge/ so that kernels/ holds no
`__init__.py` and can never be imported as the top-level `kernels` that PyPI's package of that
name (a dependency of transformers) owns.

Their GPU tooling (timing tables, SASS, config checks) lives in the repository's `tools/gpu/`
(not installed), the published BitDelta design as a baseline in `zenedge.bench`. Importing this
package loads nothing.
"""
