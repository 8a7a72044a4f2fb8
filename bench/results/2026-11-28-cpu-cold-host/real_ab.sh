#!/bin/bash
# The real loop (the model's forward, the step clock's host phases): real_host.py on the session's
# start code (17145dc, a worktree in $BEFORE) and now, alternated ROUNDS times (default 2), 3 prompts,
# 128 tokens, each method planned with the pinned curve of ../2026-11-28-cpu-host-split (ar: none).
# Run from the repository root; writes real_ab.txt beside this script.
HERE=bench/results/2026-11-28-cpu-cold-host
BEFORE=${BEFORE:-/work/wt-s5}
: > $HERE/real_ab.txt
for round in $(seq ${ROUNDS:-2}); do
  for side in before now; do
    dir=$PWD; [ $side = before ] && dir=$BEFORE
    flock /tmp/timing.lock .venv/bin/python $HERE/real_host.py "$dir" ar,pld,suffix,lookahead+pld,hybrid 3 "$side-$round" 2>&1 \
      | grep -v -i warn >> $HERE/real_ab.txt
  done
done
