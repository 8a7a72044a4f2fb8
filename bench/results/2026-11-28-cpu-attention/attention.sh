#!/bin/bash
# The skinny attention alone (attention_alone.c), the start code's kernel (22dd756) against this
# code's, alternated ROUNDS times (default 3): hot (the pools in the caches), in the L3 (8 MB read,
# then the pools, then 4 MB, before each call: as the layer stack's side stream leaves them) and
# cold (100 MB read before each call), T = 1, 2, 4, 8, 16 rows over 512 and 1500 keys; and first,
# every output the same bits. Built with the flags kernels/skinny.py gives this CPU's avx512 build.
# Run from the repository root; writes attention.txt beside this script (summarize.py: the table).
set -e
HERE=bench/results/2026-11-28-cpu-attention
W=$(mktemp -d)
FLAGS=$(.venv/bin/python -c "from kernels import skinny; print(' '.join(skinny.FLAGS + skinny.ISAS['avx512'][0] + skinny._extra_flags('avx512')))")
git show 22dd756:kernels/cpu/skinny_attention.c > $W/before.c
cp kernels/cpu/skinny_attention.c $W/now.c
for side in before now; do gcc $FLAGS -Ikernels/cpu -o $W/$side.so $W/$side.c -lm; done
gcc -O2 -fopenmp -o $W/alone $HERE/attention_alone.c -ldl
{
echo "# flags: $FLAGS"
echo "# same bits (T/L):"
for T in 1 2 5 8 16 33; do for L in 40 100 512 777; do
  DUMP=$W/o0 $W/alone $W/before.so $T $L 1 > /dev/null; DUMP=$W/o1 $W/alone $W/now.so $T $L 1 > /dev/null
  cmp -s $W/o0 $W/o1 && echo -n "$T/$L same  " || echo -n "$T/$L DIFFERENT  "
done; done; echo
for round in $(seq ${ROUNDS:-3}); do
  for L in 512 1500; do for T in 1 2 4 8 16; do for side in before now; do
    echo "round $round $side hot  $(flock /tmp/timing.lock $W/alone $W/$side.so $T $L 1000)"
    echo "round $round $side L3   $(FLUSH=8 L3=1 flock /tmp/timing.lock $W/alone $W/$side.so $T $L 150)"
    echo "round $round $side cold $(FLUSH=100 flock /tmp/timing.lock $W/alone $W/$side.so $T $L 100)"
  done; done; done
done
} > $HERE/attention.txt
rm -rf $W
