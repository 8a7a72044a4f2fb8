#!/bin/bash
# The host work at batch 8, caches cold: bench/host_step.py --batch-size 8 --limit 8 (40 prompts in 5 batches of 8)
# --cold 100, three runs back to back: now, before (51a6f40, a worktree in $BEFORE, run with this host_step.py), now.
# NOW: the code timed as "now" (default: this checkout). Run from the repository root; writes host_b8.txt here.
HERE=bench/results/2026-11-28-cpu-one-step
BEFORE=${BEFORE:-/work/wt-s11}
ANSWERS=${ANSWERS:-/tmp/host_step_answers8.json}
cp bench/host_step.py "$BEFORE/bench/host_step.py"
OUTFILE=$HERE/host_b8.txt
METHODS=${METHODS:-ar,pld,suffix,lookahead+pld,hybrid}
{
  echo "# bench/host_step.py --batch-size 8 --limit 8 --cold 100 --repeats 3 --methods $METHODS"
  echo "# (40 prompts in 5 batches of 8, planned with the pinned reference curve), ms a step; three runs back to back:"
  echo "# now ($(git -C "${NOW:-$PWD}" rev-parse --short HEAD)'s code), before (51a6f40, a worktree), now again"
} > $OUTFILE
for side in now before now; do
  dir=${NOW:-$PWD}; [ $side = before ] && dir=$BEFORE
  (cd "$dir" && flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" bench/host_step.py --batch-size 8 --limit 8 \
     --methods $METHODS --cold 100 --repeats 3 --answers "$ANSWERS" 2>&1 | grep "^| [a-z]" | grep -v "| method" \
     | sed "s/^/$side /") >> $OUTFILE
done
git -C "$BEFORE" checkout -q bench/host_step.py
