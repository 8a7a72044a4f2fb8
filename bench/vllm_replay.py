"""Our drafter inside vLLM, replayed without vLLM: tokens per forward from greedy outputs alone.

In greedy decoding vLLM's speculative output is its plain output, token for token (checked in
every ``--compare-vllm`` run), and vLLM accepts a draft's longest prefix that agrees with it.
So once the greedy outputs are known, the chains our proposer sends, what vLLM accepts of each,
and the forwards it takes follow from the tokens alone. This replays vLLM's calls of
``decoding.vllm.TokenDrafter`` the way ``bench/vllm_compare.py`` runs it: one request at a
time, its warm-up request first (the shortest prompt, 4 tokens), a propose call after every
step (the prefill's and the last one's included), a finished request retired into the shared store when the next
request's first call arrives. It counts forwards as that file does (the prefill not counted),
so its tau is the vLLM run's, to a forward per request (tested against a recorded run in
tests/test_vllm_replay.py).

What it is for: tuning the drafter's settings on the dev split in seconds per setting, where a
vLLM run takes minutes, and without vLLM installed. It says nothing about time: a longer chain
costs vLLM a wider forward.

    python bench/run.py --methods ar --split dev --limit 8 --out bench/out/dev-ar
    python bench/vllm_replay.py bench/out/dev-ar/results.json --min-chance 0,0.02,0.05 --k 10,16
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from decoding.planner import node_keys  # noqa: E402
from decoding.vllm import DRAFTERS, TokenDrafter, VllmDrafterConfig  # noqa: E402

WARMUP_TOKENS = 4  # bench/vllm_compare.py's warm-up request: the shortest prompt, this many tokens
MAX_MODEL_LEN = 8192  # the default model's positions: vLLM's max_model_len, the depth limit near the end


def replay_request(drafter: TokenDrafter, prompt: Sequence[int], output: Sequence[int]) -> dict:
    """One request through the drafter as vLLM's runner calls it; ``output`` is its greedy
    output (vLLM's, ours: the same). Returns new tokens, forwards (after the prefill), the
    tokens each forward gained and the draft tokens sent to the verified forwards."""
    if not output:
        return {"new_tokens": 0, "forwards": 0, "accept_lengths": [], "drafted": 0}
    width = len(prompt) + len(output) + 1
    row = np.zeros((1, width), dtype=np.int64)
    ctx = list(prompt) + [output[0]]  # the prefill brings the first token
    row[0, :len(ctx)] = ctx
    sampled, pos, gains, sent = [output[0]], 1, [], 0
    while True:
        # vLLM proposes after every step, the one that finishes the request included (its draft
        # is dropped, but the drafter has seen the whole output when it retires the request)
        draft = drafter.propose_rows([sampled], [len(ctx)], row)[0]
        if pos >= len(output):
            break
        sent += len(draft)
        a = 0
        while a < len(draft) and pos + a < len(output) and draft[a] == output[pos + a]:
            a += 1
        gained = list(output[pos:pos + a + 1])  # the accepted drafts and the target's own token
        row[0, len(ctx):len(ctx) + len(gained)] = gained
        ctx += gained
        pos += len(gained)
        sampled = gained
        gains.append(len(gained))
    return {"new_tokens": len(output), "forwards": len(gains), "accept_lengths": gains, "drafted": sent}


class HindsightDrafter(TokenDrafter):
    """The same trees, each step's chain chosen knowing the output: the longest path of the tree
    that the output follows. Its tau bounds what any way of choosing one chain from these trees
    could reach (it is not a drafter: it reads the future)."""

    truth: Sequence[int] = ()  # the request's prompt and output

    def draft(self, req, depth: int) -> list[int]:
        tree = self.tree(req, depth)
        n = len(req.tokens)
        future, v, path = self.truth[n:n + depth], 0, []
        while len(path) < len(future):
            c = tree.children[v].get(future[len(path)])
            if c is None:
                break
            path.append(c)
            v = c
        req.sent = [tree.tokens[x] for x in path]
        req.keys = [node_keys(tree, x, req.acc.streak) for x in path]
        return req.sent


def replay(cfg: VllmDrafterConfig, k: int, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]],
           max_model_len: int = MAX_MODEL_LEN, hindsight: bool = False) -> list[dict]:
    """Every request in order, after the warm-up request, through one drafter (one engine): the
    shared store carries each finished request into the next ones, as in vLLM. ``hindsight``:
    the chains of ``HindsightDrafter`` instead of ours."""
    drafter = (HindsightDrafter if hindsight else TokenDrafter)(cfg, num_speculative_tokens=k,
                                                              max_model_len=max_model_len)

    def one(p, o):
        drafter.truth = list(p) + list(o)
        return replay_request(drafter, p, o)

    if prompts:
        w = min(range(len(prompts)), key=lambda i: len(prompts[i]))
        one(prompts[w], outputs[w][:WARMUP_TOKENS])
    return [one(p, o) for p, o in zip(prompts, outputs)]


def first_turns(results: Path, model: Optional[str] = None) -> tuple[list[dict], list[list[int]]]:
    """The ``ar`` first turns of a benchmark's results.json (a run on the suite, either split),
    in run order, and their prompt ids: the chat template applied to the first user turn, as
    the benchmark does."""
    from bench.data.suite import load_suite
    from models.loader import load_tokenizer

    data = json.loads(results.read_text())
    recs = [r for r in data["records"] if r["method"] == "ar" and r["turn"] == 1]
    if not recs or "output_ids" not in recs[0]:
        raise ValueError(f"{results}: needs ar first turns with their output_ids (a results.json as bench/run.py "
                         "writes it, before output_ids are stripped)")
    first = {r["id"]: r["turns"][0] if r["task"] == "chat" else r["prompt"]
             for split in ("dev", "test") for r in load_suite(split=split)}
    missing = [r["id"] for r in recs if r["id"] not in first]
    if missing:
        raise ValueError(f"{results}: {len(missing)} records are not suite prompts (e.g. {missing[0]}); the replay "
                         "takes runs on the suite")
    tok = load_tokenizer(model or data["header"]["model"].split(" (")[0])
    prompts = [tok.apply_chat_template([{"role": "user", "content": first[r["id"]]}], add_generation_prompt=True,
                                       tokenize=True, return_dict=False) for r in recs]
    return recs, prompts


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, help="a bench/run.py results.json with ar first turns")
    p.add_argument("--drafter", default="hybrid", help=f"comma list of {', '.join(DRAFTERS)}")
    p.add_argument("--k", default="10", help="comma list: num_speculative_tokens")
    p.add_argument("--min-chance", default=None,
                   help="comma list: a chain stops below this chance (default: each drafter's own)")
    p.add_argument("--max-nodes", default="64", help="comma list: candidate nodes a chain is chosen from")
    p.add_argument("--model", default=None, help="tokenizer (default: the results' model)")
    p.add_argument("--hindsight", action="store_true",
                   help="also the tau of the best chain of the same trees in hindsight (an upper bound for the "
                        "choice of the chain)")
    args = p.parse_args(argv)
    drafters = [d.strip() for d in args.drafter.split(",") if d.strip()]
    for d in drafters:
        if d not in DRAFTERS:
            p.error(f"--drafter must be among {', '.join(DRAFTERS)}, got {d!r}")
    ks, nodes = _ints(args.k), _ints(args.max_nodes)
    chances = [None] if args.min_chance is None else _floats(args.min_chance)
    for name, vals, lo in (("--k", ks, 1), ("--max-nodes", nodes, 1)):
        if not vals or min(vals) < lo:
            p.error(f"{name} takes integers >= {lo}, got {vals}")
    if not chances or not all(c is None or 0.0 <= c < 1.0 for c in chances):
        p.error(f"--min-chance takes numbers in [0, 1), got {chances}")
    if not args.results.is_file():
        p.error(f"no results file at {args.results}")
    recs, prompts = first_turns(args.results, args.model)
    outputs = [r["output_ids"] for r in recs]
    tasks = sorted({r["task"] for r in recs})
    print(f"{len(recs)} first turns ({', '.join(tasks)}) from {args.results}")
    print("tau: tokens per forward (the prefill not counted) over all first turns, then per task; sent: draft "
          "tokens sent per forward" + ("; hindsight: tau of the best chain of the same trees, chosen knowing the "
                                      "output" if args.hindsight else ""))
    hind = " hindsight |" if args.hindsight else ""
    print("| drafter | k | min_chance | max_nodes | tau | sent |" + hind + " " + " | ".join(tasks) + " |")
    print("|---|---:|---:|---:|---:|---:|" + ("---:|" if args.hindsight else "") + "---:|" * len(tasks))
    for d, k, c, n in itertools.product(drafters, ks, chances, nodes):
        cfg = VllmDrafterConfig(drafter=d, min_chance=c, max_nodes=n)
        got = replay(cfg, k, prompts, outputs)

        def tau(rows):
            return sum(g["new_tokens"] for g in rows) / max(sum(g["forwards"] for g in rows), 1)

        per = [tau([g for g, r in zip(got, recs) if r["task"] == t]) for t in tasks]
        sent = sum(g["drafted"] for g in got) / max(sum(g["forwards"] for g in got), 1)
        best = ""
        if args.hindsight and d == "mix":  # no tree: its chain is drafted a token at a time
            best = " |"
        elif args.hindsight:  # the chain's choice, not the trees, is what the setting's min_chance cuts
            seen = replay(VllmDrafterConfig(drafter=d, max_nodes=n), k, prompts, outputs, hindsight=True)
            best = f" {tau(seen):.3f} |"
        print(f"| {d} | {k} | {cfg.min_chance:g} | {n} | {tau(got):.3f} | {sent:.2f} |{best} "
              + " | ".join(f"{x:.2f}" for x in per) + " |", flush=True)


if __name__ == "__main__":
    main()
