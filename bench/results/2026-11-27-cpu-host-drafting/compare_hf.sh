set -x
M=ar,pld,lookahead,lookahead+pld,recycle,suffix,hybrid
cd /work/wt-start && PYTHONPATH=/work/wt-start /work/main/.venv/bin/python bench/run.py --compare-hf --limit 2 --weights fp32 --methods $M --out /tmp/ba2-before > /tmp/ba2-before.log 2>&1
cd /work/main && .venv/bin/python bench/run.py --compare-hf --limit 2 --weights fp32 --methods $M --out /tmp/ba2-after > /tmp/ba2-after.log 2>&1
echo done > /tmp/ba2.done
