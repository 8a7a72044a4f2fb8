#!/bin/bash
# The Q4_1 gate_up product (3072 x 576) alone from C, at 1 / 4 / 8 / 16 rows, 1 and 2 threads, with
# its weights hot (one copy, the same call again) and cold (100 copies, 110 MB, taken in turn), beside
# the vpdpbusd and fp32 FMA peaks of kernels/cpu/roofline.c, ROUNDS rounds (default 3).
# Run from the repository root; builds into $W (default /tmp/products8).
set -e
W=${W:-/tmp/products8}; mkdir -p $W
HERE=$(dirname "$0")
FL="-O3 -std=c11 -ffp-contract=off -fopenmp -mavx2 -mfma -mavx512f -mavx512dq -mavx512bw -mavx512vl -mf16c -mavx512bf16 -mavx512vnni -Ikernels/cpu"
gcc $FL $HERE/qbench.c kernels/cpu/*.c -lm -o $W/qbench
cat > $W/roof.c <<'C'
#include <stdio.h>
#include <stdint.h>
double roofline_fma_peak(int bits, int64_t iters, int threads);
double roofline_int8_peak(int kind, int64_t iters, int threads);
int main(void) {
    printf("peaks: vpdpbusd 2T %.0f 1T %.0f GOP/s, fp32 FMA 512-bit 2T %.0f GFLOP/s\n", roofline_int8_peak(2, 20000000, 2),
           roofline_int8_peak(2, 20000000, 1), roofline_fma_peak(512, 20000000, 2));
    return 0;
}
C
gcc $FL $W/roof.c kernels/cpu/roofline.c -lm -o $W/roof
for r in $(seq ${ROUNDS:-3}); do
  echo "round $r $(date +%T)"
  flock /tmp/timing.lock $W/roof
  for T in 1 2; do
    flock /tmp/timing.lock $W/qbench 3072 576 1 1000 $T 1 4 8 16 | sed 's/^/hot  /'
    flock /tmp/timing.lock $W/qbench 3072 576 100 10 $T 1 4 8 16 | sed 's/^/cold /'
  done
done
