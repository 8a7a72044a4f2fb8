#!/bin/bash
# Builds kernels/cpu/skinny_attention.c at HEAD and variants.py's variants as small libraries, and
# times each with bench.c (T rows over L keys, smollm2's heads, fp16 pools, 2 threads, the fastest
# of 5 x N calls), alternated ROUNDS times. Run from this folder; writes into $W (default /tmp/attn8).
set -e
W=${W:-/tmp/attn8}; mkdir -p $W
ROOT=$(git rev-parse --show-toplevel)
cp $ROOT/kernels/cpu/skinny_attention.c $ROOT/kernels/cpu/skinny_common.h bench.c $W/
cp $W/skinny_attention.c $W/base.c
(cd $W && python3 $OLDPWD/variants.py skinny_attention.c)
FL="-O3 -std=c11 -ffp-contract=off -fopenmp -shared -fPIC -mavx2 -mfma -mavx512f -mavx512dq -mavx512bw -mavx512vl -mf16c -mavx512bf16 -mavx512vnni"
for v in base v12 noqk nosm pvonly none; do
  gcc $FL -I$W $W/$v.c -o $W/$v.so -lm
  gcc -O2 $W/bench.c $W/$v.so -Wl,-rpath,$W -o $W/bench_$v
done
for r in $(seq ${ROUNDS:-3}); do
  for T in 1 8; do
    for v in base v12 noqk nosm pvonly none; do
      [ $T = 1 ] && [ $v != base ] && [ $v != v12 ] && continue
      flock /tmp/timing.lock $W/bench_$v $T ${L:-512} ${N:-2000} | sed "s/^/round $r $v /"
    done
  done
done
