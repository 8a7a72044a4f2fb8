"""Prefill time by chunk size: python prefill_chunk.py CHUNKS PROMPT_LENGTHS (comma lists).

One prompt of random tokens per length, generate(..., max_new_tokens=1) with each chunk size in
interleaved rounds (the order reversed every other round), each chunk size's fastest of 4."""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from decoding.generate import generate  # noqa: E402
from models.loader import load_model  # noqa: E402

torch.set_num_threads(2)
model = load_model("smollm2").model
gen = torch.Generator().manual_seed(0)
chunks = [int(c) for c in sys.argv[1].split(",")]
for n in [int(x) for x in sys.argv[2].split(",")]:
    prompt = [int(t) for t in torch.randint(100, 40000, (n,), generator=gen)]
    best, first = {}, {}
    for r in range(4):
        for c in (chunks if r % 2 == 0 else chunks[::-1]):
            t = time.perf_counter()
            first[c] = generate(model, [prompt], max_new_tokens=1, prefill_chunk=c)[0].output_ids
            best[c] = min(best.get(c, 1e9), time.perf_counter() - t)
    same = len({str(o) for o in first.values()}) == 1
    print(n, " ".join(f"{c}:{best[c]:.3f}s" for c in chunks), "same first token:", same, flush=True)
