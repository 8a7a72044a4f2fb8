#!/usr/bin/env bash
# --compare-hf --limit 2 (the default native weights), the session's start code (6f1f089, a worktree)
# then this code, back to back on the same machine.
M=ar,pld,lookahead+pld,suffix,hybrid
(cd /work/wt-before && PYTHONPATH=/work/wt-before /work/main/.venv/bin/python bench/run.py --compare-hf --limit 2 \
    --methods $M --out /tmp/chf-before > /tmp/chf-before.log 2>&1)
/work/main/.venv/bin/python bench/run.py --compare-hf --limit 2 --methods $M --out /tmp/chf-after > /tmp/chf-after.log 2>&1
echo done > /tmp/chf.done
