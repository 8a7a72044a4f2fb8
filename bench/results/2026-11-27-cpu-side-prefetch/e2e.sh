#!/bin/bash
# The start of the session (e22af4b, in $BEFORE) and this code, alternated twice on the default
# native weights, then this code beside llama.cpp. Run from the repository root.
set -e
OUT=bench/results/2026-11-27-cpu-side-prefetch
BEFORE=${BEFORE:-/work/wt-start}
for r in 1 2; do
  for side in before after; do
    dir=$PWD; [ $side = before ] && dir=$BEFORE
    (cd "$dir" && flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" bench/run.py --limit 1 --weights native \
        --methods ar,pld,lookahead+pld,suffix,hybrid --out "$OLDPWD/$OUT/e2e-$side-$r" > /dev/null 2>&1)
    echo "$side $r done"
  done
done
SPECDEC_LLAMACPP_DIR=${SPECDEC_LLAMACPP_DIR:-/work/wt-llamacpp/.llamacpp} flock /tmp/timing.lock .venv/bin/python bench/run.py \
    --limit 1 --weights native --methods ar,pld,suffix,hybrid --compare-llamacpp --out $OUT/llamacpp > /dev/null 2>&1
echo llamacpp done
