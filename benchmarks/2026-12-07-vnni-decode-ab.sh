#!/bin/sh
# Decode tok/s of the avx512 and avx512vnni builds, interleaved (tools/decode_rate.py), on a home
# that stores BASE: sh benchmarks/2026-12-07-vnni-decode-ab.sh BASE TOKENS (ZENEDGE_HOME set).
for round in 1 2; do
  for isa in avx512 avx512vnni; do
    printf '%s round %s: ' "$isa" "$round"
    ZENEDGE_CPU_ISA=$isa python tools/decode_rate.py --base "$1" --tokens "$2" --rounds 2 2>/dev/null \
      | python -c "import json, sys; print(round(json.load(sys.stdin)['tokens_per_s'], 1), 'tok/s')"
  done
done
