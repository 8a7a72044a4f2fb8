"""A prompt's prefill (N random tokens through the default model in causal chunks of the CPU's
default size, the last chunk's last row's logits, as decoding.generate prefills) with two builds of
the CPU library (argv: N NAME=PATH.so ...), alternated in one process: the median over 5 rounds of
each build's fastest of 3 (ms, tokens/s). Run from the repository root."""
import ctypes
import statistics
import sys
import time

import torch

from bench.model_speed import setup_batch
from decoding.generate import default_prefill_chunk
from kernels import skinny
from models.loader import default_model_path, load_model
from models.runner import ModelRunner, StepInput

skinny._load()
n = int(sys.argv[1])
libs = {}
for arg in sys.argv[2:]:
    name, path = arg.split("=")
    libs[name] = ctypes.CDLL(path)
    skinny._declare(libs[name])
model = load_model(default_model_path(), tune=False, weights="native").model
runner = ModelRunner(model, cache_tokens=n + 64, block_size=16)
chunk = default_prefill_chunk(model.device)
prompt = torch.randint(0, model.cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(0)).tolist()
res = {k: [] for k in libs}
for _ in range(5):
    for name, lib in libs.items():
        skinny._lib = lib
        best = 1e9
        for _ in range(3):
            setup_batch(runner, 1, 0)
            with torch.inference_mode():
                t = time.perf_counter()
                for c in range(-(-n // chunk)):
                    piece = prompt[c * chunk:(c + 1) * chunk]
                    last = (c + 1) * chunk >= n
                    runner.step([StepInput(0, piece, logits_rows=[len(piece) - 1] if last else [])])
                    runner.commit({0: list(range(len(piece)))})
                best = min(best, time.perf_counter() - t)
        res[name].append(best * 1e3)
med = {k: statistics.median(v) for k, v in res.items()}
base = list(libs)[0]
print(f"prefill {n} tokens, chunk {chunk}: " + " ".join(
    f"{k} {med[k]:.1f} ms ({n / med[k] * 1e3:.0f} tok/s, {med[k] / med[base]:.2f})" for k in libs))
