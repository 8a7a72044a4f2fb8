"""Plain greedy decoding (``ar``) of the default model on the fp32 path and on the quantized
paths in one run: decode tok/s (the tokens after the first over the time after the prefill),
fastest of ``--reps`` runs per path, the paths interleaved; and whether each path's greedy
output is the fp32 path's.

    flock /tmp/timing.lock python bench/results/2026-11-27-cpu-quant/ar_speed.py --threads 2
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from models.loader import load_model  # noqa: E402
from models.runner import ModelRunner, StepInput  # noqa: E402

PROMPTS = ["What is the capital of France? Answer in one sentence.",
           "Write a Python function that returns the n-th Fibonacci number, with a docstring."]


def decode(model, prompt: list[int], new: int) -> tuple[list[int], float]:
    """Greedy tokens and the seconds of the decoding steps after the prefill."""
    runner = ModelRunner(model, cache_tokens=len(prompt) + new + 16)
    runner.add_sequence(0)
    with torch.inference_mode():
        _, top1, _ = runner.step_greedy([StepInput(0, prompt)])[0]
        runner.commit({0: list(range(len(prompt)))})
        out = [top1[-1]]
        t0 = time.perf_counter()
        for _ in range(new - 1):
            _, top1, _ = runner.step_greedy([StepInput(0, [out[-1]])])[0]
            runner.commit({0: [0]})
            out.append(top1[0])
        return out, time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--weights", default="fp32,q8_0,native")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    paths = args.weights.split(",")
    models, loads = {}, {}
    for w in paths:
        t0 = time.perf_counter()
        models[w] = load_model(weights=w)
        loads[w] = time.perf_counter() - t0
    tok = models[paths[0]].tokenizer
    print(f"threads {args.threads}, {args.new} new tokens, load average {os.getloadavg()[0]:.1f}; load_model s: "
          + ", ".join(f"{w} {s:.1f}" for w, s in loads.items()))
    print("| weights | prompt | decode tok/s | output = fp32's |")
    print("|---|---:|---:|---|")
    for i, text in enumerate(PROMPTS):
        prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)
        best, outs = {}, {}
        for _ in range(args.reps):
            for w in paths:
                outs[w], t = decode(models[w].model, prompt, args.new)
                best[w] = min(best.get(w, float("inf")), t)
        for w in paths:
            same = ""
            if "fp32" in outs:
                agree = next((j for j, (a, b) in enumerate(zip(outs[w], outs["fp32"])) if a != b), None)
                same = "yes" if agree is None else f"first {agree} tokens"
            print(f"| {w} | {i} | {(args.new - 1) / best[w]:.1f} | {same} |", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
