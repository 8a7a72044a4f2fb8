#!/bin/bash
# The decoding attention with 512-bit FMAs against the session's start code (47f09fd, a worktree in
# $BEFORE), alternated ROUNDS times (default 3): the kernel alone (attention_alone.py: us a call,
# the fastest of 300, 1-16 causal rows over 512 fp16 keys, smollm2's heads), then the forward's
# phases (bench/model_speed.py --weights native, 1-16 step tokens, the fastest of 7).
# Run from the repository root; writes ab.txt and model_speed-<side>-<round>/ beside this script.
HERE=bench/results/2026-11-28-cpu-attention512
BEFORE=${BEFORE:-/work/wt-s8}
: > $HERE/ab.txt
for round in $(seq ${ROUNDS:-3}); do
  for side in before now; do
    dir=$PWD; [ $side = before ] && dir=$BEFORE
    echo "$side $round alone $(cd "$dir" && PYTHONPATH="$dir" flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" "$OLDPWD/$HERE/attention_alone.py")" >> $HERE/ab.txt
    (cd "$dir" && PYTHONPATH="$dir" flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" bench/model_speed.py --weights native \
       --batch 1 --step-batch 1 --step-tokens 1,4,8,16 --reps 7 --out "$OLDPWD/$HERE/model_speed-$side-$round" > /dev/null 2>&1)
    echo "$side $round forward done" >> $HERE/ab.txt
  done
done
