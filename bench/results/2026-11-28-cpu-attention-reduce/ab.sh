#!/bin/bash
# Before (10cd1e2) and now (f786e61): both libraries built for this CPU, then the attention alone and
# the forward, each build's calls alternated in one process. Run from the repository root; writes
# attention_ab.txt and forward_ab.txt beside this script.
set -e
HERE=bench/results/2026-11-28-cpu-attention-reduce
PY=.venv/bin/python
mkdir -p /tmp/attention-reduce
$PY $HERE/build_lib.py 10cd1e2 /tmp/attention-reduce/before.so
$PY $HERE/build_lib.py f786e61 /tmp/attention-reduce/now.so
LIBS="before=/tmp/attention-reduce/before.so now=/tmp/attention-reduce/now.so"
flock /tmp/timing.lock $PY $HERE/attention_ab.py $LIBS | tee $HERE/attention_ab.txt
flock /tmp/timing.lock $PY $HERE/forward_ab.py $LIBS | tee $HERE/forward_ab.txt
