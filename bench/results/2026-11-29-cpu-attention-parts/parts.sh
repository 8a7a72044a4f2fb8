#!/bin/bash
# The decoding attention's parts at 8 rows and 1 row over 1,024 keys (the default model's heads,
# fp16 pools, a causal step), one thread, hot: the whole kernel, then with one part or several
# dropped (variants.py), ROUNDS rounds (default 3) alternated, each the fastest of 1000 calls and
# the mean of the second half (attention_alone.c of ../2026-11-28-cpu-attention), each round
# between two measurements of one core's 512-bit FMA peak (kernels.skinny.fma_peak_gflops). Run from
# the repository root; writes parts.txt beside this script.
set -e
HERE=bench/results/2026-11-29-cpu-attention-parts
W=$(mktemp -d)
FLAGS=$(.venv/bin/python -c "from kernels import skinny; print(' '.join(skinny.FLAGS + skinny.ISAS['avx512'][0] + skinny._extra_flags('avx512')))")
.venv/bin/python $HERE/variants.py kernels/cpu/skinny_attention.c $W/v.c
declare -A V=([all]="" [no_qk]="-DNO_QK" [no_pv]="-DNO_PV" [no_qk_pv]="-DNO_QK -DNO_PV"
              [no_qk_pv_sm]="-DNO_QK -DNO_PV -DNO_SM" [no_qk_pv_sm_merge]="-DNO_QK -DNO_PV -DNO_SM -DNO_MERGE"
              [no_pf]="-DNO_PF")
NAMES="all no_qk no_pv no_qk_pv no_qk_pv_sm no_qk_pv_sm_merge no_pf"
for v in $NAMES; do gcc $FLAGS ${V[$v]} -Ikernels/cpu -o $W/$v.so $W/v.c -lm; done
gcc -O2 -fopenmp -o $W/alone bench/results/2026-11-28-cpu-attention/attention_alone.c -ldl
{
echo "# flags: $FLAGS"
peak() { flock /tmp/timing.lock .venv/bin/python -c \
  "from kernels import skinny; print(f'fma512 one core {skinny.fma_peak_gflops(512, threads=1):.1f} GFLOP/s')"; }
for r in $(seq ${ROUNDS:-3}); do
  echo "round $r $(peak)"
  for v in $NAMES; do for T in 8 1; do
    echo "round $r $v $(TH=1 flock /tmp/timing.lock $W/alone $W/$v.so $T 1024 1000)"
  done; done
  echo "round $r $(peak)"
done
} > $HERE/parts.txt
rm -rf $W
