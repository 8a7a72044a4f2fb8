"""One forward of a random 1- or 8-token tree step over 256 committed tokens (the curve's),
back to back, after a 2 ms sleep, and after a 2 ms spin of the main thread, rounds interleaved:
whether the host's time between forwards changes a forward's time.

    python bench/results/2026-11-26-cpu-roofline-fast/idle_between.py
"""

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from kernels.backend import get_backend  # noqa: E402
from models.cost import tree_step  # noqa: E402
from models.loader import load_model  # noqa: E402
from models.runner import ModelRunner  # noqa: E402


def spin(ms: float) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < ms / 1e3:
        pass


def main() -> None:
    model, _ = load_model("smollm2", get_backend("torch"), torch.float32, "cpu")
    gen = torch.Generator().manual_seed(0)
    runner = ModelRunner(model, cache_tokens=4096, block_size=16)
    runner.add_sequence(0)
    runner.assume_context(0, 256)
    modes = {"back to back": lambda: None, "sleep 2 ms": lambda: time.sleep(0.002), "spin 2 ms": lambda: spin(2)}
    for T in (1, 8):
        step = tree_step(T, model.cfg.vocab_size, gen)
        got = {m: [] for m in modes}
        for _ in range(12):
            for m, between in modes.items():
                for _ in range(3):
                    tokens, meta, idx = runner.prepare([step])
                    between()
                    t = time.perf_counter()
                    runner.forward_greedy(tokens, meta, idx)
                    got[m].append((time.perf_counter() - t) * 1e3)
        for m, v in got.items():
            print(f"{T} tokens, {m}: fastest {min(v):.2f} ms, median {statistics.median(v):.2f} ms")


if __name__ == "__main__":
    main()
