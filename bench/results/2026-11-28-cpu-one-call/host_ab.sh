# bench/host_step.py --cold 100 (one round) per method, the session's start code (a worktree, $BEFORE,
# with this session's host_step.py copied in as bench/host_step_cold.py: --cold is new) and this
# code alternated R times; prints each method's min and median host ms a step and its phases'
# medians. Run from the root of this code:
#   git worktree add /work/wt-s5 fbff725; cp bench/host_step.py /work/wt-s5/bench/host_step_cold.py
#   python bench/host_step.py --answers /tmp/host_step_answers.json   # once: ar's answers
#   R=5 bash bench/results/2026-11-28-cpu-one-call/host_ab.sh
M=${M:-ar,pld,suffix,lookahead+pld,hybrid}
PY=${PY:-$PWD/.venv/bin/python}
R=${R:-5}
OUT=$(realpath -m "${OUT:-bench/results/2026-11-28-cpu-one-call/host_ab.txt}")
: > $OUT
for r in $(seq $R); do
 for m in ${M//,/ }; do
  (cd ${BEFORE:-/work/wt-s5} && "$PY" bench/host_step_cold.py --answers /tmp/host_step_answers.json --methods $m --repeats 1 --cold 100 $EXTRA 2>&1 | grep "^|" | grep -v "\-\-\-\|method" | sed "s/^/before /" >> $OUT)
  ("$PY" bench/host_step.py --answers /tmp/host_step_answers.json --methods $m --repeats 1 --cold 100 $EXTRA 2>&1 | grep "^|" | grep -v "\-\-\-\|method" | sed "s/^/now /" >> $OUT)
 done
done
python3 - $OUT <<'PY'
import sys, collections
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split("|")]
    d[(f[1], f[0])].append([float(x) for x in f[3:10]])
print("method: host ms a step, before / now: min, median; phases (medians) plan propose pack verify commit update")
for m in dict.fromkeys(m for m, _ in d):
    b, n = d[(m, "before")], d[(m, "now")]
    med = lambda xs, i: sorted(x[i] for x in xs)[len(xs) // 2]
    print(f"{m:14s} min {min(x[6] for x in b):.3f} / {min(x[6] for x in n):.3f}   median {med(b, 6):.3f} / {med(n, 6):.3f}   "
          + " ".join(f"{med(b, i):.3f}/{med(n, i):.3f}" for i in range(6)))
PY
