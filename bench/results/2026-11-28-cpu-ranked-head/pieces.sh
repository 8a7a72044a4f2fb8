#!/usr/bin/env bash
# The pieces alone, the session's start code (726ae86, in $BEFORE) and this code alternated twice:
# a forward's pieces outside its layers' C call, the attention plan alone, the host work alone
# (bench/host_step.py, the oracle in place of the forward); then the quantized head with its top-k
# (this code: both calls exist here). Run from the repository root:
#   bash bench/results/2026-11-28-cpu-ranked-head/pieces.sh > bench/results/2026-11-28-cpu-ranked-head/pieces.txt
set -euo pipefail
HERE=bench/results/2026-11-28-cpu-ranked-head
BEFORE=${BEFORE:-/work/wt-s5}
PY=${PY:-$PWD/.venv/bin/python}
NOW=$PWD
for round in 1 2; do
  for side in before now; do
    dir=$NOW; [ $side = before ] && dir=$BEFORE
    echo "== round $round, $side"
    (cd "$dir" && "$PY" "$NOW/$HERE/forward_pieces.py" 2>/dev/null)
    (cd "$dir" && "$PY" "$NOW/$HERE/plan_alone.py" 2>/dev/null)
    (cd "$dir" && "$PY" bench/host_step.py --answers /tmp/host_step_answers.json --repeats 3 \
        --methods ar,pld,lookahead+pld,suffix,hybrid 2>/dev/null | tail -7)
  done
done
echo "== the head alone (this code)"
"$PY" "$HERE/head_alone.py"
