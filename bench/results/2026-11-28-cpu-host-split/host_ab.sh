#!/bin/bash
# The host work alone, caches cold: bench/host_step.py --cold 100 on the session's start code
# (10bbe97, a worktree in $BEFORE) and now, alternated ROUNDS times (default 5), one round per
# method each. Run from the repository root; writes host_ab-final.txt beside this script.
HERE=bench/results/2026-11-28-cpu-host-split
BEFORE=${BEFORE:-/work/wt-s5}
ANSWERS=${ANSWERS:-/tmp/host_step_answers.json}
: > $HERE/host_ab-final.txt
for round in $(seq ${ROUNDS:-5}); do
  for side in before now; do
    dir=$PWD; [ $side = before ] && dir=$BEFORE
    (cd "$dir" && flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" bench/host_step.py --methods ar,pld,suffix,lookahead+pld,hybrid \
       --cold 100 --repeats 1 --answers "$ANSWERS" 2>&1 | grep "^| [a-z]" | grep -v "| method" | sed "s/^/$side $round /") \
      >> $HERE/host_ab-final.txt
  done
done
