#!/bin/bash
# compare-hf --limit 2: before (dd7b17d worktree), after (main), before, after
set -x
PIN=/work/main/bench/results/2026-11-28-cpu-side-off/pinned_step_cost.json
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then D=/work/wt-before; else D=/work/main; fi
    cd $D && flock /tmp/timing.lock /work/main/.venv/bin/python bench/run.py --compare-hf --limit 2 --methods ar,pld,lookahead+pld,suffix,hybrid --step-cost $PIN --out /tmp/s17/hf/$side-$round > /tmp/s17/hf/$side-$round.log  # then stripped into compare-hf-$side-$round/ 2>&1
  done
done
echo done > /tmp/s17/hf/DONE
