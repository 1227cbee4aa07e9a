"""Benchmarks of the runtime: `zenedge bench run` / `python -m zenedge.bench`.

Importing this package is cheap (no torch); each benchmark imports what it needs when it runs.
"""
