#!/usr/bin/env bash
# The whole GPU measurement plan in one call (see bench/README.md).
#
#   bash bench/gpu_session.sh [GGUF] [OUTDIR] [STEPS]
#
# GGUF defaults to /tmp/m/smollm2.gguf (copied there beforehand: a GPU box may have no index), OUTDIR to
# $OUT (the device tool's return folder) or out/gpu, STEPS to "tests,kernels,speed,e2e" (any comma
# subset, run in that order; "graphs", "profile" and "exact" are not in the default list). Needs the `gguf` wheel (GGUF reading, ours and transformers') and
# `hypothesis` (the n-gram kernel's property tests) importable there. Each step writes its own
# log, so a step that fails or runs out of time does not lose the others:
#   tests    the Triton kernels' unit tests, run natively on the GPU against their references
#   kernels  kernel microbenchmarks (Triton vs torch reference, FlexAttention, SDPA)
#   speed    model speed at Mistral-7B shapes, bf16: decode bandwidth, step-cost curve
#   graphs   model speed with steps replayed from CUDA graphs (--cuda-graphs) beside eager, SmolLM2 and 7B shapes
#   profile  one SmolLM2-shape step profiled: host / device ms and launches, eager and replayed
#   e2e      end to end on the real default model with Triton kernels, beside transformers
#   exact    the exact path (--exact, issue 53): its tests natively, every method's bf16 greedy identity
#            to ar with and without --exact (--cuda-graphs --limit 1 --repeats 2), replayed forward
#            times with and without it (SmolLM2 and 7B shapes), and its one-token step profiled
#            (launches a forward, against the profile step's default path); not in the default list
# BEFORE_DIR (optional): another checkout of this repository (e.g. `git archive START | tar -x -C
# .gpu/before`, carried along): the e2e step then runs there first and here second, on the same
# warm machine, so a change's before / after comes from one device call (e2e_before/, e2e/).
set -u
PY=${PYTHON:-python3}  # the GPU machine's python3 holds its torch
GGUF=${1:-/tmp/m/smollm2.gguf}
DIR=${2:-${OUT:-out/gpu}}
STEPS=",${3:-tests,kernels,speed,e2e},"
mkdir -p "$DIR"
export PYTHONUNBUFFERED=1
LOG="$DIR/log.txt"
{
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv
    $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} >> "$LOG" 2>&1
step() { [[ "$STEPS" == *",$1,"* ]]; }
stamp() { echo "$(date +%T) $*" | tee -a "$LOG"; }

if step tests; then
    stamp "tests: start"
    # TEST_FILES narrows the list; with pytest-xdist installed the tests run in TEST_WORKERS
    # processes (Triton's cold compiles are host work, one core each)
    FILES=${TEST_FILES:-tests/test_kernel_ngram_match.py tests/test_kernel_kv_ops.py tests/test_kernel_tree_attention.py
        tests/test_kernel_norm.py tests/test_kernel_elementwise.py tests/test_graphs.py tests/test_kernel_compile.py
        tests/test_kernel_checks.py tests/test_kernel_exact.py}
    XDIST=""
    $PY -c "import xdist" 2>/dev/null && XDIST="-n ${TEST_WORKERS:-8}"
    # shellcheck disable=SC2086
    timeout "${TESTS_S:-240}" $PY -m pytest -q -p no:cacheprovider $XDIST $FILES > "$DIR/kernel_tests.txt" 2>&1
    stamp "tests: rc $? ($(tail -1 "$DIR/kernel_tests.txt"))"
fi
if step kernels; then
    stamp "kernels: start"
    timeout "${KERNELS_S:-150}" $PY bench/kernels.py > "$DIR/kernels.md" 2>> "$LOG"
    stamp "kernels: rc $?"
fi
if step speed; then
    stamp "model_speed: start"
    timeout "${SPEED_S:-200}" $PY bench/model_speed.py --out "$DIR/speed" ${SPEED_ARGS:-} >> "$LOG" 2>&1
    stamp "model_speed: rc $?"
fi
if step graphs; then
    for shape in smollm2-135m mistral-7b; do
        stamp "graphs $shape: start"
        timeout "${GRAPHS_S:-120}" $PY bench/model_speed.py --shape $shape --cuda-graphs --batch 1,8 \
            --step-batch ${GRAPHS_STEP_BATCH:-1,8} --out "$DIR/graphs_$shape" >> "$LOG" 2>&1
        stamp "graphs $shape: rc $?"
    done
fi
if step profile; then
    stamp "profile: start"
    timeout "${PROFILE_S:-90}" $PY bench/profile_step.py --shape smollm2-135m --cuda-graphs --out "$DIR/profile" \
        > "$DIR/profile.md" 2>> "$LOG"
    stamp "profile: rc $?"
fi
if step e2e; then
    if [ -f "$GGUF" ]; then
        stamp "e2e: start"
        # one prompt per task by default (eager steps are host-bound: a run of every prompt does
        # not fit a session's GPU time); E2E_ARGS adds flags (e.g. --cuda-graphs)
        if [ -n "${BEFORE_DIR:-}" ] && [ -d "$BEFORE_DIR" ]; then
            stamp "e2e before ($BEFORE_DIR): start"
            (cd "$BEFORE_DIR" && timeout "${E2E_S:-300}" $PY bench/run.py --kernel triton --model "$GGUF" \
                --limit "${E2E_LIMIT:-1}" --out "$(realpath "$DIR")/e2e_before" ${E2E_ARGS:-}) >> "$LOG" 2>&1
            stamp "e2e before: rc $?"
        fi
        timeout "${E2E_S:-300}" $PY bench/run.py --kernel triton --model "$GGUF" --compare-hf \
            --limit "${E2E_LIMIT:-1}" --out "$DIR/e2e" ${E2E_ARGS:-} >> "$LOG" 2>&1
        stamp "e2e: rc $?"
    else
        stamp "e2e: skipped, no model at $GGUF"
    fi
fi
if step exact; then
    # Sized for one device call: at most 580 s with every part at its timeout (tests 100, each e2e
    # run 140, each SmolLM2-shape speed run 35, each 7B-shape one 50, the profile 30), in order of
    # importance.
    # EXACT_GRAPHS="" and EXACT_E2E_ARGS / EXACT_SPEED_ARGS let a CPU dry run use tiny settings.
    GRAPHS=${EXACT_GRAPHS---cuda-graphs}
    stamp "exact tests: start"
    timeout "${EXACT_TESTS_S:-100}" $PY -m pytest -q -p no:cacheprovider -m "" tests/test_kernel_exact.py \
        tests/test_exact.py > "$DIR/exact_tests.txt" 2>&1
    stamp "exact tests: rc $? ($(tail -1 "$DIR/exact_tests.txt"))"
    if [ -f "$GGUF" ]; then
        for mode in on off; do  # every method's bf16 greedy output against ar's, with the timings
            flag=""; [ "$mode" = on ] && flag="--exact"
            stamp "exact e2e $mode: start"
            # shellcheck disable=SC2086
            timeout "${EXACT_E2E_S:-140}" $PY bench/run.py --kernel triton --model "$GGUF" $GRAPHS $flag \
                --limit 1 --repeats 2 --out "$DIR/exact_e2e_$mode" ${EXACT_E2E_ARGS:-} >> "$LOG" 2>&1
            stamp "exact e2e $mode: rc $?"
        done
    else
        stamp "exact e2e: skipped, no model at $GGUF"
    fi
    for shape in smollm2-135m mistral-7b; do  # replayed forward times, each path in its own run
        points="--batch 1 --step-tokens 1,2,4,8,16,32,64 --step-batch 1"; secs=${EXACT_SPEED_S:-35}
        [ "$shape" = mistral-7b ] && points="--batch 1 --step-tokens 1,16,64 --step-batch 1" && secs=${EXACT_7B_S:-50}
        for mode in on off; do
            flag=""; [ "$mode" = on ] && flag="--exact"
            stamp "exact speed $shape $mode: start"
            # shellcheck disable=SC2086
            timeout "$secs" $PY bench/model_speed.py --shape $shape --kernel triton $GRAPHS $flag \
                $points --out "$DIR/exact_speed_${shape}_$mode" ${EXACT_SPEED_ARGS:-} >> "$LOG" 2>&1
            stamp "exact speed $shape $mode: rc $?"
        done
    done
    # one table: identical to ar and ms per token after the first, without / with --exact
    $PY - "$DIR" <<'PYEOF' > "$DIR/exact_summary.md" 2>> "$LOG"
import json, sys
from pathlib import Path
from bench.report import summarize
from bench.results_md import _ms_per_token
out = Path(sys.argv[1])
runs = {m: json.loads((out / f"exact_e2e_{m}" / "results.json").read_text())
        for m in ("off", "on") if (out / f"exact_e2e_{m}" / "results.json").exists()}
print("| method | identical off | identical on | ms/token off | ms/token on |\n|---|---:|---:|---:|---:|")
methods = list(dict.fromkeys(r["method"] for d in runs.values() for r in d["records"]))
for meth in methods:
    cells = []
    for key in ("identical", "ms"):
        for m in ("off", "on"):
            recs = runs[m]["records"] if m in runs else []
            s = summarize(recs).get((meth, "all")) if recs else None
            if key == "identical":
                cells.append("-" if s is None or s["identical"] is None else f"{s['identical']:.0%}")
            else:
                cells.append("-" if s is None else f"{_ms_per_token(recs, meth):.2f}")
    print(f"| {meth} | " + " | ".join(cells) + " |")
PYEOF
    stamp "exact summary: rc $?"
    stamp "exact profile: start"  # launches a forward on the exact path (the profile step: the default's)
    # shellcheck disable=SC2086
    timeout "${EXACT_PROFILE_S:-30}" $PY bench/profile_step.py --shape smollm2-135m --kernel triton $GRAPHS --exact \
        --out "$DIR/exact_profile" > "$DIR/exact_profile.md" 2>> "$LOG"
    stamp "exact profile: rc $?"
    cat "$DIR/exact_tests.txt" | tail -3
    cat "$DIR/exact_summary.md" "$DIR"/exact_speed_*/model_speed.md "$DIR/exact_profile.md" 2>/dev/null
fi
cat "$DIR/kernels.md" "$DIR/speed/model_speed.md" "$DIR"/graphs_*/model_speed.md "$DIR/profile.md" "$DIR/e2e/results.md" 2>/dev/null
