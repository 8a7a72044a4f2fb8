#!/bin/bash
# The forward before (the start code 22dd756, in $BEFORE) and now, alternated ROUNDS times (default
# 3): bench/model_speed.py on the default GGUF (native weights), decode at batch 1 and 8 over 512 keys
# and steps of 1, 4 and 8 tokens at batch 1, with the layer stack's phases. Run from the repository
# root; writes forward_ab.txt beside this script.
HERE=bench/results/2026-11-28-cpu-attention
BEFORE=${BEFORE:-/work/wt-s5}
MODEL=$(.venv/bin/python -c "from models.loader import default_model_path as p; print(p())")
: > $HERE/forward_ab.txt
for round in $(seq ${ROUNDS:-3}); do
  for side in before now; do
    dir=$PWD; [ $side = before ] && dir=$BEFORE
    out=$(cd "$dir" && flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" bench/model_speed.py --weights native --model "$MODEL" \
          --batch 1,8 --step-batch 1 --step-tokens 1,4,8 --reps 7 --out /tmp/forward_ab_$side 2>&1)
    { echo "== round $round $side"; echo "$out" | grep -E "^\| (1|8) \| |^\| active \| (1|8) \| "; } >> $HERE/forward_ab.txt
  done
done
