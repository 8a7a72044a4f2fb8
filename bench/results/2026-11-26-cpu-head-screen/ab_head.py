"""The LM head screen on and off in one process, interleaved rounds (SPECDEC_HEAD_SCREEN is read
at every step): (1) a greedy step's forward (``ModelRunner.forward_greedy``) of the default
model at 1-64 step tokens against the roofline measured in the same run; (2) end to end, greedy,
planner on, every method on the test split's first turns, outputs compared.

    python bench/results/2026-11-26-cpu-head-screen/ab_head.py [--limit 2] [--rounds 2] [--out DIR]
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.model_speed import against_roofline, attention_flops, product_flops, roofline, weight_bytes  # noqa: E402
from models.cost import step_cost, tree_step  # noqa: E402
from models.loader import DEFAULT_CACHE_DIR, load_model  # noqa: E402
from models.runner import ModelRunner  # noqa: E402

SETTINGS = {"screen": "1", "logits": "0"}


def forwards(model, tokens=(1, 4, 8, 16, 32, 64), context=512, rounds=7) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    runner = ModelRunner(model, cache_tokens=context + 128, block_size=16)
    runner.add_sequence(0)
    runner.assume_context(0, context)
    steps = {T: runner.prepare([tree_step(T, model.cfg.vocab_size, gen)]) for T in tokens}
    best = {(s, T): float("inf") for s in SETTINGS for T in tokens}
    for r in range(rounds + 1):
        for s, env in (list(SETTINGS.items()) if r % 2 else list(SETTINGS.items())[::-1]):
            os.environ["SPECDEC_HEAD_SCREEN"] = env
            for T, prepared in steps.items():
                t = time.perf_counter()
                runner.forward_greedy(*prepared)
                if r:
                    best[(s, T)] = min(best[(s, T)], (time.perf_counter() - t) * 1e3)
    roof = roofline(torch.device("cpu"), torch.float32, None, 0.0)
    layer_f, head_f = product_flops(model)
    wbytes = weight_bytes(model)
    out = []
    for T in tokens:
        flops = (layer_f + head_f) * T + attention_flops(model.cfg, T, context + T)
        row = {"tokens": T}
        for s in SETTINGS:
            a = against_roofline(best[(s, T)], wbytes, flops, roof)
            row[s] = {"ms": round(best[(s, T)], 3), "vs_roofline": round(a["vs_roofline"], 3),
                      "floor_ms": round(a["roofline_ms"], 3), "bound": a["bound"]}
        out.append(row)
    return out, roof


def end_to_end(model, tok, limit: int, rounds: int, methods: list[str], max_new: int = 128) -> dict:
    from bench.data.suite import load_suite
    from decoding.generate import generate
    from decoding.methods import make_proposer
    from decoding.options import planner_for

    recs = load_suite(split="test", limit=limit)
    prompts = []
    for r in recs:
        turn = r["turns"][0] if r["task"] == "chat" else r["prompt"]
        prompts.append((r["task"], tok.apply_chat_template([{"role": "user", "content": turn}],
                                                           add_generation_prompt=True, tokenize=True,
                                                           return_dict=False)))
    eos = tuple(model.cfg.eos_token_ids)
    costs = {}
    for s, env in SETTINGS.items():
        os.environ["SPECDEC_HEAD_SCREEN"] = env
        costs[s] = step_cost(model, DEFAULT_CACHE_DIR)
    acc = {(s, m): {"s": 0.0, "tokens": 0, "forwards": 0} for s in SETTINGS for m in methods}
    outs: dict = {}
    for r in range(rounds):
        order = list(SETTINGS.items()) if r % 2 == 0 else list(SETTINGS.items())[::-1]
        for m in methods:
            for s, env in order:
                os.environ["SPECDEC_HEAD_SCREEN"] = env
                for i, (_, p) in enumerate(prompts):
                    plan = planner_for(model, m, False, None, costs[s])
                    t = time.perf_counter()
                    res = generate(model, [p], make_proposer(m), max_new_tokens=max_new, eos_token_ids=eos,
                                   planner=plan)[0]
                    a = acc[(s, m)]
                    a["s"] += time.perf_counter() - t
                    a["tokens"] += len(res.output_ids)
                    a["forwards"] += res.stats.forwards
                    outs.setdefault(i, {}).setdefault((s, m), res.output_ids)
        print(f"round {r + 1} done", flush=True)
    same = all(len({tuple(v) for v in o.values()}) == 1 for o in outs.values())
    table = {}
    for m in methods:
        table[m] = {s: {"tok_s": round(acc[(s, m)]["tokens"] / acc[(s, m)]["s"], 2),
                        "tau": round(acc[(s, m)]["tokens"] / acc[(s, m)]["forwards"], 3)} for s in SETTINGS}
    return {"prompts": len(prompts), "rounds": rounds, "max_new_tokens": max_new, "identical": same,
            "methods": table, "curves": {s: {"tokens": c.tokens, "ms": [round(x, 2) for x in c.ms]}
                                          for s, c in costs.items()}}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--limit", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--methods", default="ar,pld,suffix,hybrid,lookahead+pld")
    p.add_argument("--skip-e2e", action="store_true")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    loaded = load_model("smollm2")
    model, tok = loaded.model, loaded.tokenizer
    fw, roof = forwards(model)
    print(json.dumps(roof))
    print("| step tokens | floor ms | logits ms | x floor | screen ms | x floor | saved ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row in fw:
        lg, sc = row["logits"], row["screen"]
        print(f"| {row['tokens']} | {sc['floor_ms']:.2f} | {lg['ms']:.2f} | {lg['vs_roofline']:.2f} | {sc['ms']:.2f} | "
              f"{sc['vs_roofline']:.2f} | {lg['ms'] - sc['ms']:.2f} |", flush=True)
    res = {"roofline": roof, "forwards": fw}
    if not a.skip_e2e:
        e2e = end_to_end(model, tok, a.limit, a.rounds, a.methods.split(","))
        res["end_to_end"] = e2e
        ar = e2e["methods"]["ar"]
        print(f"identical outputs: {e2e['identical']}; {e2e['prompts']} prompts, {e2e['rounds']} rounds")
        print("| method | logits tok/s | screen tok/s | screen / logits | tau | x ar (logits) | x ar (screen) |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for m, v in e2e["methods"].items():
            print(f"| {m} | {v['logits']['tok_s']} | {v['screen']['tok_s']} | "
                  f"{v['screen']['tok_s'] / v['logits']['tok_s']:.3f} | {v['screen']['tau']} | "
                  f"{v['logits']['tok_s'] / ar['logits']['tok_s']:.2f} | "
                  f"{v['screen']['tok_s'] / ar['screen']['tok_s']:.2f} |")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "ab_head.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main()
