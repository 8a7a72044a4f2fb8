#!/bin/bash
# The host work alone, caches cold: bench/host_step.py --cold 100 on the session's start code
# (17145dc, a worktree in $BEFORE, run with this session's host_step.py: its oracle enters
# inference mode as the runner does, see NOTES.md) and now, alternated ROUNDS times (default 6), each the fastest of REPEATS interleaved rounds (default 3).
# Run from the repository root; writes host_ab.txt beside this script.
HERE=bench/results/2026-11-28-cpu-cold-host
BEFORE=${BEFORE:-/work/wt-s5}
ANSWERS=${ANSWERS:-/tmp/host_step_answers.json}
cp bench/host_step.py "$BEFORE/bench/host_step.py"
: > $HERE/host_ab.txt
for round in $(seq ${ROUNDS:-6}); do
  for side in before now; do
    dir=$PWD; [ $side = before ] && dir=$BEFORE
    (cd "$dir" && flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" bench/host_step.py --methods ar,pld,suffix,lookahead+pld,hybrid \
       --cold 100 --repeats ${REPEATS:-3} --answers "$ANSWERS" 2>&1 | grep "^| [a-z]" | grep -v "| method" | sed "s/^/$side $round /") \
      >> $HERE/host_ab.txt
  done
done
git -C "$BEFORE" checkout -q bench/host_step.py
