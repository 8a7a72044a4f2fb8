#!/bin/bash
# Each thread's part of a quantized product alone (one layer's four Q4_1 products, 30 copies of
# each so that the weights come from the L3 as in a forward, 2 threads): make_qg.py writes an
# instrumented copy of kernels/cpu/quant_gemm.c (a timestamp where each thread enters the
# region, ends its tiles and where the region is over), harness.c calls it. Run from the
# repository root: bash bench/results/2026-11-29-cpu-around-the-stack/threads/run.sh [M ...]
set -e
HERE=bench/results/2026-11-29-cpu-around-the-stack/threads
W=${W:-/tmp/threads}; mkdir -p $W
FLAGS=$(.venv/bin/python -c "from kernels import skinny; print(' '.join(skinny.FLAGS + skinny.ISAS['avx512'][0] + skinny._extra_flags('avx512')))" 2>/dev/null)
python3 $HERE/make_qg.py kernels/cpu/quant_gemm.c $W/qg.c
gcc ${FLAGS/-shared/} -Ikernels/cpu -c $W/qg.c -o $W/qg.o
gcc -O2 -fopenmp $HERE/harness.c $W/qg.o -o $W/harness -lm
for M in ${@:-1 4 8}; do flock /tmp/timing.lock $W/harness $M; done
