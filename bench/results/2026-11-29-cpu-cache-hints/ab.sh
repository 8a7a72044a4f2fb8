#!/bin/bash
# alternate main and the NTA worktree: host phases and forward per step
PIN=/work/main/bench/results/2026-11-28-cpu-side-off/pinned_step_cost.json
for r in 1 2 3; do
  for tag in main dem; do
    d=/work/main; [ $tag = dem ] && d=/work/wt-dem
    cd $d && flock /tmp/timing.lock /work/main/.venv/bin/python bench/run.py --limit 1 --methods ar,pld,hybrid --step-cost $PIN --out /tmp/s14/dem/$tag-$r > /tmp/s14/dem/$tag-$r.log 2>&1
    echo "== $tag-$r $(date +%T)"; grep -A6 "^| method | steps | forward" /tmp/s14/dem/$tag-$r/results.md
  done
done
