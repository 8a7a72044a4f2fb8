set -x
cd /work/wt-base && PYTHONPATH=/work/wt-base /work/main/.venv/bin/python bench/run.py --compare-hf --limit 1 --methods ar,pld,lookahead+pld,suffix,hybrid --out /tmp/ba-before > /tmp/ba-before.log 2>&1
cd /work/main && .venv/bin/python bench/run.py --compare-hf --limit 1 --methods ar,pld,lookahead+pld,suffix,hybrid --out /tmp/ba-after > /tmp/ba-after.log 2>&1
