"""A prompt's prefill on the default model (one forward of T random tokens, logits for the last
row only), its attention on the prefill kernel against SDPA, interleaved rounds, fastest of 3.

    python bench/results/2026-11-27-cpu-prefill-kernel/model_ab.py --threads 1 --tokens 500,1000,2000
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from kernels import skinny  # noqa: E402
from models.loader import load_model  # noqa: E402
from models.runner import ModelRunner, StepInput  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", default="500,1000,2000")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    runner = ModelRunner(load_model().model, cache_tokens=4096 + 64)
    g = torch.Generator().manual_seed(0)
    group = skinny.MAX_PREFILL_GROUP

    def once(t, kernel):
        skinny.MAX_PREFILL_GROUP = group if kernel else 0  # 0: kernels/torch_plan.py routes nothing to it
        toks = torch.randint(100, 40000, (t,), generator=g).tolist()
        runner.add_sequence(1)
        t0 = time.perf_counter()
        runner.step([StepInput(1, toks, logits_rows=[t - 1])])
        dt = time.perf_counter() - t0
        runner.free(1)
        return dt * 1e3

    print(f"build: {skinny.build_tag()}, threads {args.threads}")
    print("| tokens | SDPA ms | prefill kernel ms | SDPA / kernel |")
    print("|---:|---:|---:|---:|")
    for t in map(int, args.tokens.split(",")):
        once(t, True), once(t, False)
        a, b = [], []
        for _ in range(args.rounds):
            a.append(once(t, False))
            b.append(once(t, True))
        print(f"| {t} | {min(a):.0f} | {min(b):.0f} | {min(a) / min(b):.3f} |", flush=True)
    skinny.MAX_PREFILL_GROUP = group


if __name__ == "__main__":
    main()
