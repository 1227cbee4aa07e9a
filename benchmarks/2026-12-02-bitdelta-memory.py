"""2026-12-02, issue [O]. Usage: python benchmarks/2026-12-02-bitdelta-memory.py always|never.
Resident memory of the default base plus 8 BitDelta variants, dense copies ("always", as before
[O]) against packed only (the default now): process RSS after loading, and the cache's own count."""
import dataclasses, gc, os, sys, tempfile
from pathlib import Path
import psutil, torch
from zenedge.bench.throughput import resolve_base
from zenedge.bench.variants import make_bitdelta
from zenedge.runtime.cache import DeltaCache
from zenedge.runtime.dense_bitdelta import DenseBitDeltas
from zenedge.runtime.model import load_resident
from zenedge.runtime.variants import load_bitdelta

policy = sys.argv[1]
base_dir, _, scratch = resolve_base(None, lambda m: None)
work = Path(tempfile.mkdtemp())
files = [make_bitdelta(base_dir, work, work / f"d{i}.bitdelta", seed=i) for i in range(2)]
resident = load_resident("b", base_dir, torch.device("cpu"), torch.float32, "int4")
gc.collect()
before = psutil.Process().memory_info().rss
cache, dense = DeltaCache(64 << 30), DenseBitDeltas(DeltaCache(64 << 30))
dense.cache = cache
variants = [dense.prepare(cache.get(f"v{i}", lambda i=i: load_bitdelta(f"v{i}", files[i % 2], torch.device("cpu"))),
                          resident.model, policy) for i in range(8)]
gc.collect()
after = psutil.Process().memory_info().rss
print(f"{policy}: RSS +{(after - before) / 1e6:.0f} MB for 8 BitDelta variants; the cache counts {cache.used_bytes / 1e6:.0f} MB "
      f"({cache.used_bytes / 8e6:.1f} MB each); base resident: RSS {before / 1e6:.0f} MB")
