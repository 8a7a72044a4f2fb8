#!/usr/bin/env bash
# The 1.5B's ar on this code's native weights and on fp32, back to back (issue 51: ar at least 3x
# its fp32 speed), one round each.
set -euo pipefail
OUT=${1:-out/fp32}
PY=${PY:-$PWD/.venv/bin/python}
ARGS="--model qwen2.5-coder-1.5b --tasks code,code_edit,chat --limit 1 --max-new-tokens 96 --methods ar"
"$PY" bench/run.py $ARGS --weights native --out "$OUT/ar-native"
"$PY" bench/run.py $ARGS --weights fp32 --out "$OUT/ar-fp32"
