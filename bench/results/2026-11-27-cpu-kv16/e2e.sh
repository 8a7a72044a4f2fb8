#!/bin/bash
# fp32 K/V (the commit before, checked out in $BEFORE) and fp16 K/V (this code), alternated:
# batch 1 (--limit 1) twice, then batches of 8 (--batch-size 8 --limit 8) once each.
# Run from the repository root.
set -e
OUT=bench/results/2026-11-27-cpu-kv16
BEFORE=${BEFORE:-/work/wt-var}
M=ar,pld,lookahead+pld,suffix,hybrid
run() {  # side tag args...
  local side=$1 tag=$2; shift 2
  local dir=$PWD; [ "$side" = before ] && dir=$BEFORE
  (cd "$dir" && flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" bench/run.py --methods $M "$@" \
      --out "$OLDPWD/$OUT/$tag-$side" > /dev/null 2>&1)
  echo "$tag $side done"
}
for r in 1 2; do
  run before b1-$r --limit 1
  run after b1-$r --limit 1
done
run before b8 --limit 8 --batch-size 8
run after b8 --limit 8 --batch-size 8
