#!/bin/bash
# bench/run.py --limit 2 with the side stream forced on (SPECDEC_SIDE_PREFETCH=1: the code before
# 457b090 on any machine) and by the cache size (the default: off on this machine), back to back,
# ROUNDS rounds (default 2), the order swapped each round; each setting plans with its own measured
# step-cost curve (the cache key tells them apart). Run from the repository root.
set -e
OUT=${OUT:-bench/results/2026-11-28-cpu-side-off}
for round in $(seq 1 ${ROUNDS:-2}); do
sides="on auto"; [ $((round % 2)) = 0 ] && sides="auto on"
for side in $sides; do
  env=""; [ $side = on ] && env="SPECDEC_SIDE_PREFETCH=1"
  flock /tmp/timing.lock env $env .venv/bin/python bench/run.py --limit 2 \
      --methods ar,pld,lookahead+pld,suffix,hybrid --out "$OUT/e2e-$side-$round" > /dev/null 2>&1
  echo "$side $round done $(date +%T)"
done
done
