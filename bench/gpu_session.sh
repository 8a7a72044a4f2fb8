#!/usr/bin/env bash
# The whole GPU measurement plan in one call (see the README's "On a GPU" notes).
#
#   bash bench/gpu_session.sh [GGUF] [OUTDIR]
#
# GGUF defaults to /tmp/m/smollm2.gguf (copied there beforehand: a GPU box may have no index), OUTDIR to
# $OUT (the device tool's return folder) or out/gpu. Needs the `gguf` wheel on PYTHONPATH there
# (GGUF reading, ours and transformers'). Steps, each writing its own log so that a step that
# fails or runs out of time does not lose the others (8 files come back: the device tool's limit):
#   1. kernel microbenchmarks (Triton vs torch reference, FlexAttention, SDPA)
#   2. model speed at Mistral-7B shapes, bf16: decode bandwidth, step-cost curve
#   3. end to end on the real default model with Triton kernels, beside transformers
set -u
GGUF=${1:-/tmp/m/smollm2.gguf}
DIR=${2:-${OUT:-out/gpu}}
mkdir -p "$DIR"
export PYTHONUNBUFFERED=1
LOG="$DIR/log.txt"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv > "$LOG" 2>&1
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$LOG" 2>&1

timeout 150 python bench/kernels.py > "$DIR/kernels.md" 2>> "$LOG"
echo "kernels: rc $?" | tee -a "$LOG"
timeout 200 python bench/model_speed.py --out "$DIR/speed" >> "$LOG" 2>&1
echo "model_speed: rc $?" | tee -a "$LOG"
if [ -f "$GGUF" ]; then
    timeout 200 python bench/run.py --kernel triton --model "$GGUF" --compare-hf --limit 4 --out "$DIR/e2e" >> "$LOG" 2>&1
    echo "e2e: rc $?" | tee -a "$LOG"
else
    echo "e2e: skipped, no model at $GGUF" | tee -a "$LOG"
fi
cat "$DIR/kernels.md" "$DIR/speed/model_speed.md" "$DIR/e2e/results.md" 2>/dev/null
