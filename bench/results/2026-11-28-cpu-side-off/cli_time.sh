#!/bin/bash
# Wall time of a command-line answer (python -m decoding, 32 new tokens, the default model) at the
# code before a2db2b1 ($BEFORE, a worktree) and at this checkout, alternated ROUNDS times (default 3).
BEFORE=${BEFORE:-/work/wt-s12b}
for r in $(seq ${ROUNDS:-3}); do
  for side in before now; do
    dir=$PWD; [ $side = before ] && dir=$BEFORE
    for m in ar hybrid; do
      (cd $dir && /usr/bin/time -f "round $r $side $m %e s" flock /tmp/timing.lock "$OLDPWD/.venv/bin/python" -W ignore \
         -m decoding "Name three primary colours." --method $m --max-new-tokens 32 > /dev/null)
    done
  done
done
