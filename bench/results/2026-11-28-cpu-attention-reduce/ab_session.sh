#!/bin/bash
# The session's start (10cd1e2) and its end (87770df: the attention's reductions, the vector
# quantization of activations, the attention's merge on both threads): both libraries built for
# this CPU, then the attention alone, the quantized products and the forward, each build's calls
# alternated in one process. Run from the repository root; writes *_session.txt beside this script.
set -e
HERE=bench/results/2026-11-28-cpu-attention-reduce
PY=.venv/bin/python
mkdir -p /tmp/attention-reduce
$PY $HERE/build_lib.py 10cd1e2 /tmp/attention-reduce/start.so
$PY $HERE/build_lib.py 87770df /tmp/attention-reduce/end.so
LIBS="before=/tmp/attention-reduce/start.so now=/tmp/attention-reduce/end.so"
flock /tmp/timing.lock $PY $HERE/attention_ab.py $LIBS | tee $HERE/attention_session.txt
flock /tmp/timing.lock $PY $HERE/products_ab.py $LIBS | tee $HERE/products_session.txt
flock /tmp/timing.lock $PY $HERE/forward_ab.py $LIBS | tee $HERE/forward_session.txt
