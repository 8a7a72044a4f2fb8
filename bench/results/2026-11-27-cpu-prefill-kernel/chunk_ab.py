"""A prompt's prefill in causal chunks as decoding.generate runs it (each chunk committed before
the next), chunk sizes interleaved, fastest of 3, with the prefill kernel (the attention of a
later chunk over its prefix included).

    python bench/results/2026-11-27-cpu-prefill-kernel/chunk_ab.py --threads 2 --tokens 1000,2000
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from models.loader import load_model  # noqa: E402
from models.runner import ModelRunner, StepInput  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", default="1000,2000")
    p.add_argument("--chunks", default="256,512,1024,2048")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    runner = ModelRunner(load_model().model, cache_tokens=4096 + 64)
    g = torch.Generator().manual_seed(0)

    def once(n, chunk):
        toks = torch.randint(100, 40000, (n,), generator=g).tolist()
        runner.add_sequence(1)
        t0 = time.perf_counter()
        for s in range(0, n, chunk):
            piece = toks[s:s + chunk]
            runner.step([StepInput(1, piece, logits_rows=[len(piece) - 1] if s + chunk >= n else [])])
            runner.commit({1: list(range(len(piece)))})
        dt = time.perf_counter() - t0
        runner.free(1)
        return dt * 1e3

    chunks = [int(c) for c in args.chunks.split(",")]
    print(f"threads {args.threads}; ms, fastest of {args.rounds}")
    print("| tokens | " + " | ".join(f"chunk {c}" for c in chunks) + " |")
    print("|---:|" + "---:|" * len(chunks))
    for n in map(int, args.tokens.split(",")):
        once(n, chunks[0])
        best = {c: float("inf") for c in chunks}
        for _ in range(args.rounds):
            for c in chunks:
                best[c] = min(best[c], once(n, c))
        print(f"| {n} | " + " | ".join(f"{best[c]:.0f}" for c in chunks) + " |", flush=True)


if __name__ == "__main__":
    main()
