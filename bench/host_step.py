"""A step's host work alone: every method's decoding replayed without the model's forward.

    python bench/host_step.py [--methods ar,pld,...] [--limit 1] [--batch-size 1] [--no-plan]
                              [--step-cost FILE] [--repeats 3] [--cold MB] [--calls] [--out DIR]

The forward is replaced by an oracle that knows each prompt's greedy answer (computed once
with ``ar`` and the real forward, cached): a node whose path follows that answer gets its
true next token as the argmax, so every draft is accepted or rejected as it would be on the
model, and the output must equal ``ar``'s (checked). A node off that path gets the answer's
token at its position (plus the tokens after it as its top-k): what lookahead's window and
recycling learn from such rows is made up, so their tau here is not the model's. Everything
else is the real code: planning (with a pinned step-cost curve and no learning of the host's
time, so every run makes the same plans), proposing, packing the step's arrays, verifying,
committing the K/V (moved in the real cache), updating. It prints the step clock's host
phases per step (``decoding.stats.StepClock``), fastest of ``--repeats`` interleaved rounds,
so the host's drift reaches every method alike, and writes ``host_step.json`` with ``--out``.
Without a forward each run takes seconds, so a change to the host path is measured in the
same minute as the code before it. In the real loop the forward streams the weights through the
caches, and the host work after it finds its code and objects cold (several times slower per
call than hot); ``--cold MB`` has the oracle read that many megabytes in each step's place of the
forward (the default model's weights: about 100), so the host phases are timed as the real loop
sees them. The times drift with the machine (up to 2x within the hour); ``--calls`` adds each
method's Python calls a step by phase, counted under a profiler, which do not: after a forward
each call pays its lines from memory, so the count is what a change to the host path takes out.
"""

import argparse
import json
import sys
import time
from typing import Optional
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decoding import compiled  # noqa: E402
from models.runner import ModelRunner, StepInput, _inference  # noqa: E402

DEFAULT_COST = Path(__file__).resolve().parent / "data" / "step_cost_reference.json"


class OracleLogits:
    """The logits rows of an oracle step: there are none, only their argmax and top-k."""

    def __init__(self, rows: int, vocab: int):
        self.shape = torch.Size((rows, vocab))

    def tensor(self):
        raise RuntimeError("the host-step oracle has no logits: only greedy proposers that read the argmax / top-k "
                           "(Outcome.argmax, Outcome.top_rows) run under it")


class OracleRunner(ModelRunner):
    """A ``ModelRunner`` whose greedy steps pack and commit for real but take every row's
    argmax / top-k from ``answers`` (sequence id -> prompt + its greedy answer)."""

    def __init__(self, model, answers: dict[int, list[int]], flush: Optional[torch.Tensor] = None, **kw):
        super().__init__(model, **kw)
        self.answers = answers
        self.flush = flush  # read in each step's place of the forward (--cold), or None

    def head_screen(self, k: int = 1):
        return None

    @_inference
    def step(self, inputs: list[StepInput], mark=None):
        """The prefill's chunks: packed for real; each logits row one-hot at its argmax."""
        self.prepare(inputs)
        out = []
        for inp in inputs:
            _, top1, _ = self._tops(inp, 1)
            rows = torch.zeros(len(top1), self.cfg.vocab_size)
            rows[torch.arange(len(top1)), torch.tensor(top1, dtype=torch.long)] = 1.0
            out.append(rows)
        return out

    @_inference
    def step_greedy(self, inputs: list[StepInput], k: int = 1, mark=None):
        self.prepare(inputs, reuse=True)  # as ModelRunner.step_greedy
        if mark is not None:
            mark("pack")
        out = [self._tops(inp, max(1, k)) for inp in inputs]
        if self.flush is not None:
            self.flush.sum()
        if mark is not None:
            mark("forward")
        return out

    def _tops(self, inp: StepInput, k: int):
        ref, ctx = self.answers[inp.seq_id], self.cache.lengths[inp.seq_id]
        T = len(inp.tokens)
        parents = inp.parents if inp.parents is not None else list(range(-1, T - 1))
        on = [False] * T  # the node's path (root included) is the answer's text
        for i in range(T):
            d = ctx + (inp.depths[i] if inp.depths is not None else i)
            on[i] = (parents[i] < 0 or on[parents[i]]) and d < len(ref) and ref[d] == inp.tokens[i]
        rows = range(T) if inp.logits_rows is None else inp.logits_rows
        tops = []
        for r in rows:
            pos = ctx + (inp.depths[r] if inp.depths is not None else r) + 1
            top = [ref[p] for p in range(pos, min(pos + 2 * k, len(ref)))]
            top = list(dict.fromkeys(top))  # distinct, in order
            top += [t for t in range(k + len(top)) if t not in top][:k - len(top)]
            if not on[r] and pos < len(ref):  # off the answer: anything but a token that would be accepted
                top[0] = ref[pos]
            tops.append(top[:k])
        return OracleLogits(len(tops), self.cfg.vocab_size), [t[0] for t in tops], tops if k > 1 else None


def answers_for(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Each prompt's greedy answer with the real forward (``ar``), prompt included."""
    from decoding import generate

    out = generate(model, prompts, None, max_new_tokens=max_new_tokens)
    return [list(p) + r.output_ids for p, r in zip(prompts, out)]


def _counting_clock():
    """A ``StepClock`` that also counts the Python calls (functions and comprehensions: the
    profiler's "call" events) of each host phase, as its time is counted: from a step's start
    to the pack mark and from the forward mark to the update mark; the forward's place (the
    oracle's lookup), the prefill and the loop between steps are not counted, nor the counting
    clock's own overrides (the plain clock's methods are: the loop runs them)."""
    from decoding.stats import PHASES, StepClock

    class CountingClock(StepClock):
        def __init__(self):
            super().__init__()
            self.calls = dict.fromkeys(PHASES, 0)
            self._n, self._on = 0, False
            self._own = {CountingClock.start.__code__, CountingClock.mark.__code__, CountingClock._count.__code__}

        def _count(self, frame, event, arg):
            if event == "call" and self._on and frame.f_code not in self._own:
                self._n += 1

        def start(self, device=None) -> None:
            super().start(device)
            self._n, self._on = 0, True

        def mark(self, phase: str) -> None:
            super().mark(phase)
            self.calls[phase] += self._n
            self._n, self._on = 0, phase not in ("pack", "update")

    return CountingClock()


def run_method(model, name: str, batches: list[list[list[int]]], answers: list[list[int]], max_new_tokens: int,
               cost, plan: bool, flush: Optional[torch.Tensor] = None, calls: bool = False) -> dict:
    """One round of ``name`` over the batches under the oracle: host ms per step by phase,
    tau, and whether every output equals ``ar``'s. ``calls``: count the Python calls of each
    host phase instead (``calls``: per step by phase; deterministic; the times are then the
    profiler's, not the loop's)."""
    from decoding import generate, make_proposer
    from decoding.planner import Planner, PlannerConfig
    from decoding.stats import StepClock

    clock, forwards, tokens, identical, start = _counting_clock() if calls else StepClock(), 0, 0, True, 0
    t0 = time.perf_counter()
    for batch in batches:
        refs = answers[start:start + len(batch)]
        runner = OracleRunner(model, dict(enumerate(refs)), flush,
                              cache_tokens=16 * sum(-(-(len(p) + max_new_tokens + 256) // 16) for p in batch))
        planner = Planner(cost, PlannerConfig(learn_overhead=False)) if plan and name != "ar" else None
        if calls:
            sys.setprofile(clock._count)
        try:
            out = generate(model, batch, make_proposer(name), max_new_tokens=max_new_tokens, planner=planner,
                           runner=runner, step_clock=clock)
        finally:
            if calls:
                sys.setprofile(None)
        for r, p, ref in zip(out, batch, refs):
            identical &= list(p) + r.output_ids == ref
            forwards += r.stats.forwards
            tokens += len(r.output_ids)
        start += len(batch)
    per = clock.per_step()
    per.pop("forward")
    if calls:
        per["calls"] = {k: v / max(clock.steps, 1) for k, v in clock.calls.items() if k != "forward"}
        per["calls"]["host"] = sum(per["calls"].values())
    return dict(per, wall_s=time.perf_counter() - t0, tau=(tokens - len(answers)) / max(forwards, 1),
                identical=identical, sequences=len(answers))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default="ar,pld,lookahead,lookahead+pld,recycle,suffix,hybrid",
                   help="comma list of draft-free methods (default: all of them but jacobi)")
    p.add_argument("--limit", type=int, default=1, help="prompts per task of the suite's test split (default 1)")
    p.add_argument("--batch-size", type=int, default=1, help="prompts decoded together (default 1)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--no-plan", action="store_true", help="send every proposer's whole tree")
    p.add_argument("--step-cost", default=str(DEFAULT_COST),
                   help="the pinned step-cost curve the planner plans with (default: bench/data/"
                        "step_cost_reference.json)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds; the fastest is kept (default 3)")
    p.add_argument("--paths", default="compiled",
                   help="comma list of host paths to time, interleaved: compiled (decoding/compiled.py where "
                        "it builds), reference (the Python reference); default compiled")
    p.add_argument("--answers", default=None,
                   help="a JSON file of the prompts' greedy answers: read when it holds these prompts, else "
                        "computed (ar, the real forward) and written there, so that runs compared with each "
                        "other replay the same answers")
    p.add_argument("--cold", type=int, default=0, metavar="MB",
                   help="read this many megabytes in each step's place of the forward, leaving the caches as cold as "
                        "a forward does (default 0: off)")
    p.add_argument("--calls", action="store_true",
                   help="also count each method's Python calls a step by phase, in one more round under a "
                        "profiler (deterministic, unlike the times: the measure of what a change took out)")
    p.add_argument("--out", default=None, help="also write host_step.json there")
    args = p.parse_args(argv)
    for name in ("limit", "batch_size", "max_new_tokens", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.cold < 0:
        p.error(f"--cold must be >= 0 (megabytes), got {args.cold}")
    args.paths = list(dict.fromkeys(x for x in args.paths.split(",") if x))
    bad = [x for x in args.paths if x not in ("compiled", "reference")]
    if bad or not args.paths:
        p.error(f"--paths must list compiled and/or reference, got {args.paths}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    from bench.data.suite import load_suite, user_turns
    from decoding.methods import METHODS
    from models.cost import load_step_cost
    from models.loader import load_model

    methods = [m for m in dict.fromkeys(args.methods.split(",")) if m]
    bad = [m for m in methods if m not in METHODS or m.startswith("draft")]
    if bad:
        raise SystemExit(f"--methods: {bad[0]!r} is not a draft-free method ({', '.join(METHODS)})")
    cost = load_step_cost(args.step_cost)
    loaded = load_model("smollm2")
    tok = loaded.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": user_turns(r)[0]}], add_generation_prompt=True,
                                       tokenize=True, return_dict=False)
               for r in load_suite(split="test", limit=args.limit)]
    answers = None
    if args.answers and Path(args.answers).is_file():
        saved = json.loads(Path(args.answers).read_text())
        if saved.get("prompts") == prompts and saved.get("max_new_tokens") == args.max_new_tokens:
            answers = saved["answers"]
    if answers is None:
        answers = answers_for(loaded.model, prompts, args.max_new_tokens)
        if args.answers:
            Path(args.answers).write_text(json.dumps(dict(prompts=prompts, max_new_tokens=args.max_new_tokens,
                                                          answers=answers)))
    batches = [prompts[i:i + args.batch_size] for i in range(0, len(prompts), args.batch_size)]
    flush = torch.ones(args.cold * (1 << 18)) if args.cold else None
    best: dict[tuple[str, str], dict] = {}
    before = compiled.use_compiled(True)
    try:
        for _ in range(args.repeats):
            for m in methods:
                for path in args.paths:
                    compiled.use_compiled(path == "compiled")
                    r = run_method(loaded.model, m, batches, answers, args.max_new_tokens, cost, not args.no_plan,
                                   flush)
                    r["path"] = compiled.path()
                    if (m, path) not in best or r["host"] < best[m, path]["host"]:
                        best[m, path] = r
    finally:
        compiled.use_compiled(before)
    phases = ("plan", "propose", "pack", "verify", "commit", "update")
    print(f"host ms per step (fastest of {args.repeats}), {len(prompts)} prompts, batch {args.batch_size}, "
          f"{'whole trees' if args.no_plan else 'planned (pinned curve)'}, {torch.get_num_threads()} threads, "
          + (f"caches cold ({args.cold} MB read a step)" if args.cold else "caches hot"))
    print(f"| method | path | {' | '.join(phases)} | host | per seq | tau | = ar |")
    print("|---" * (len(phases) + 6) + "|")
    for (m, path), r in best.items():
        per_seq = r["host"] / min(args.batch_size, len(prompts))
        print(f"| {m} | {path} | " + " | ".join(f"{r[p]:.3f}" for p in phases)
              + f" | {r['host']:.3f} | {per_seq:.3f} | {r['tau']:.2f} | {'yes' if r['identical'] else 'NO'} |")
    if args.calls:
        print(f"\nPython calls a step (one round under a profiler; the same for the same command), "
              f"{len(prompts)} prompts")
        print(f"| method | path | {' | '.join(phases)} | host |")
        print("|---" * (len(phases) + 3) + "|")
        for (m, path), r in best.items():
            compiled.use_compiled(path == "compiled")
            try:
                counted = run_method(loaded.model, m, batches, answers, args.max_new_tokens, cost, not args.no_plan,
                                     flush, calls=True)["calls"]
            finally:
                compiled.use_compiled(before)
            r["calls"] = counted
            print(f"| {m} | {path} | " + " | ".join(f"{counted[p]:.1f}" for p in phases)
                  + f" | {counted['host']:.1f} |")
    result = dict(args=vars(args), methods={f"{m} {path}": r for (m, path), r in best.items()})
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "host_step.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
