"""What single operations cost right after 100 MB were read (the caches as a forward leaves
them), median of 200: an empty call, a call under torch's inference-mode decorator, entering
the mode, asking whether it is on, slicing a tensor, making a torch.Size.

    python bench/results/2026-11-28-cpu-cold-host/cold_ops.py
"""
import statistics
import time

import torch

flush = torch.ones(100 * (1 << 18))


@torch.inference_mode()
def decorated(x):
    return x


def plain(x):
    return x


def timed(op) -> float:
    out = []
    for _ in range(200):
        flush.sum()
        t = time.perf_counter()
        op()
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1e6


def _enter():
    with torch.inference_mode():
        pass


with torch.inference_mode():
    x = torch.zeros(4, 49152)
    ops = {"an empty Python call": lambda: plain(1),
           "a call under @torch.inference_mode()": lambda: decorated(1),
           "with torch.inference_mode(): pass": _enter,
           "torch.is_inference_mode_enabled()": torch.is_inference_mode_enabled,
           "x[0:2] (a (4, 49152) tensor)": lambda: x[0:2],
           "torch.Size((2, 49152))": lambda: torch.Size((2, 49152))}
    for name in ops:  # one warm-up each, then rounds alternated between the operations
        ops[name]()
    res = {name: [] for name in ops}
    for _ in range(3):
        for name, op in ops.items():
            res[name].append(timed(op))
print("| operation, after 100 MB read | us (median of 200, three rounds) |\n|---|---|")
for name, v in res.items():
    print(f"| {name} | {' / '.join(f'{t:.1f}' for t in v)} |")
