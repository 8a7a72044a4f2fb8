set -e
W=${W:-/tmp/split}; mkdir -p $W
HERE=bench/results/2026-11-28-cpu-attention
FLAGS=$(.venv/bin/python -c "from kernels import skinny; print(' '.join(skinny.FLAGS + skinny.ISAS['avx512'][0] + skinny._extra_flags('avx512')))" 2>/dev/null)
for s in 64 128 256; do sed "s/^#define SPLIT 64 /#define SPLIT $s /" kernels/cpu/skinny_attention.c > $W/s$s.c; gcc $FLAGS -Ikernels/cpu -o $W/s$s.so $W/s$s.c -lm; done
gcc -O2 -fopenmp -o $W/alone $HERE/attention_alone.c -ldl
for round in 1 2; do
  for L in 320 1024; do for T in 1 2 4 8; do for s in 64 128 256; do
    echo "round $round split $s T $T L $L hot $(flock /tmp/timing.lock $W/alone $W/s$s.so $T $L 1000)"
    echo "round $round split $s T $T L $L L3  $(FLUSH=8 L3=1 flock /tmp/timing.lock $W/alone $W/s$s.so $T $L 150)"
  done; done; done
done
