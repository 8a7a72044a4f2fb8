#!/bin/bash
# The kernel variants this session tried, alone (attention_alone.c), alternated ROUNDS times
# (default 2): us a call (the fastest) hot, in the L3 and in memory (as attention.sh), 1, 4, 8, 16
# rows over 512 keys. before: 22dd756; first: 4015d67 (fp16 widened at each load, 6 queries at a
# time); now: this code (first + its own keys requested 8 ahead). variants/: qb3.c (widened at
# each load, 3 queries at a time only), transposed.c (first, scores from keys transposed: other
# numbers), t0task.c (first + all of a task's keys requested into L1 at its start), ahead3.c /
# ahead4.c (first, 3 / 4 tasks ahead), widen12.c (now, but tasks of 12+ queries widened first).
# NAMES (a subset) and OUT (the file) may be set. Run from the repository root; writes variants.txt
# (or OUT) beside this script.
set -e
HERE=bench/results/2026-11-28-cpu-attention
W=$(mktemp -d)
FLAGS=$(.venv/bin/python -c "from kernels import skinny; print(' '.join(skinny.FLAGS + skinny.ISAS['avx512'][0] + skinny._extra_flags('avx512')))")
git show 22dd756:kernels/cpu/skinny_attention.c > $W/before.c
git show 4015d67:kernels/cpu/skinny_attention.c > $W/first.c
cp kernels/cpu/skinny_attention.c $W/now.c
cp $HERE/variants/*.c $W/
NAMES=${NAMES:-"before qb3 first now transposed t0task ahead3 ahead4 widen12"}
for v in $NAMES; do gcc $FLAGS -Ikernels/cpu -o $W/$v.so $W/$v.c -lm; done
gcc -O2 -fopenmp -o $W/alone $HERE/attention_alone.c -ldl
{
for round in $(seq ${ROUNDS:-2}); do
  for T in 1 4 8 16; do for v in $NAMES; do
    echo "round $round $v hot  $(flock /tmp/timing.lock $W/alone $W/$v.so $T 512 1000)"
    echo "round $round $v L3   $(FLUSH=8 L3=1 flock /tmp/timing.lock $W/alone $W/$v.so $T 512 100)"
    echo "round $round $v cold $(FLUSH=100 flock /tmp/timing.lock $W/alone $W/$v.so $T 512 60)"
  done; done
done
} > $HERE/${OUT:-variants.txt}
rm -rf $W
