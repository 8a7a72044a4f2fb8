"""Where one decoding step's time goes: host time, device time and launches per forward.

    python bench/profile_step.py [--shape smollm2-135m|mistral-7b|tiny] [--tokens 1] [--batch 1]
                                 [--context 512] [--dtype bf16] [--kernel triton] [--cuda-graphs]
                                 [--exact] [--steps 5] [--top 15] [--out DIR]

Random weights (nothing to download). Profiles ``steps`` forwards of the same prepared step
with ``torch.profiler`` after two warm-up ones: the eager forward, and with ``--cuda-graphs``
also ``ModelRunner.forward`` replaying a CUDA graph. Prints per forward the host time, the
device time, the number of launches (CUDA kernel launches by torch ops, Triton / cuBLAS launches
through the driver, graph launches), then the ops that took the most host time. On a CPU it
runs too (host time only): a smoke test of the script. The profiler adds host time of its own,
so compare the two rows of one run, not a row with an unprofiled timing. ``--exact`` profiles the
exact path (``--kernel triton``): its launches a forward against the default path's.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LAUNCH_EVENTS = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaGraphLaunch")


def parse_args(argv=None) -> argparse.Namespace:
    from bench.model_speed import DTYPES, SHAPES

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m", help="model shape (default smollm2-135m)")
    p.add_argument("--tokens", type=int, default=1, help="step tokens per sequence (a random tree; default 1)")
    p.add_argument("--batch", type=int, default=1, help="sequences in the step (default 1)")
    p.add_argument("--context", type=int, default=512, help="committed tokens per sequence (default 512)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 on a GPU, fp32 on a CPU")
    p.add_argument("--kernel", choices=["triton", "torch"], default=None,
                   help="default: triton on a GPU, torch on a CPU")
    p.add_argument("--cuda-graphs", action="store_true", help="also profile the step replayed from a CUDA graph")
    p.add_argument("--exact", action="store_true", help="the exact path (needs --kernel triton)")
    p.add_argument("--steps", type=int, default=5, help="profiled forwards per row (default 5)")
    p.add_argument("--top", type=int, default=15, help="ops listed by host time (default 15)")
    p.add_argument("--out", default=None, help="also write profile_step.json there")
    args = p.parse_args(argv)
    gpu = torch.cuda.is_available()
    args.dtype = args.dtype or ("bf16" if gpu else "fp32")
    args.kernel = args.kernel or ("triton" if gpu else "torch")
    for name in ("tokens", "batch", "context", "steps", "top"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.cuda_graphs and not (gpu and args.kernel == "triton"):
        p.error("--cuda-graphs needs a CUDA device and --kernel triton")
    if args.exact and args.kernel != "triton":
        p.error("--exact needs --kernel triton")
    if args.kernel == "triton" and not gpu:
        p.error("--kernel triton needs a GPU here (the interpreter says nothing about launches)")
    return args


def profile(fn, steps: int, device: torch.device):
    from torch.profiler import ProfilerActivity, profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for _ in range(2):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with torch_profile(activities=acts) as prof:
        for _ in range(steps):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    events = prof.key_averages()
    host_us = sum(e.self_cpu_time_total for e in events)
    dev_us = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in events)
    launches = {name: 0 for name in LAUNCH_EVENTS}
    for e in events:
        if e.key in launches:
            launches[e.key] += e.count
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    return dict(host_ms=host_us / 1e3 / steps, device_ms=dev_us / 1e3 / steps,
                launches={k: v / steps for k, v in launches.items() if v},
                top=[dict(op=e.key, calls=e.count / steps, host_us=e.self_cpu_time_total / steps) for e in top])


def main(argv=None) -> dict:
    args = parse_args(argv)
    from bench.model_speed import DTYPES, SHAPES, random_model, setup_batch
    from kernels.backend import get_backend
    from models.config import ModelConfig
    from models.cost import random_tree
    from models.runner import ModelRunner, StepInput

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = ModelConfig(**SHAPES[args.shape])
    model = random_model(cfg, get_backend(args.kernel, device, exact=args.exact), DTYPES[args.dtype], device)
    per_seq = args.context + args.tokens + 32
    runner = ModelRunner(model, cache_tokens=args.batch * per_seq, block_size=16, graphs=args.cuda_graphs)
    gen = torch.Generator().manual_seed(0)
    seqs = setup_batch(runner, args.batch, args.context)
    inputs = []
    for s in seqs:  # a random draft tree per sequence, as speculative methods send
        depths, mask = random_tree(args.tokens, gen)
        toks = [int(t) for t in torch.randint(0, cfg.vocab_size, (args.tokens,), generator=gen)]
        inputs.append(StepInput(s, toks, depths=depths, mask=mask if args.tokens > 1 else None))
    tokens, meta, idx = runner.prepare(inputs)
    rows = {}
    with torch.inference_mode():
        rows["eager forward"] = profile(lambda: model(tokens, meta, runner.cache.k, runner.cache.v, idx),
                                        args.steps, device)
        if args.cuda_graphs:
            rows["graph replay"] = profile(lambda: runner.forward(tokens, meta, idx), args.steps, device)
    head = dict(shape=args.shape, dtype=args.dtype, kernel=args.kernel, exact=args.exact, tokens=args.tokens,
                batch=args.batch,
                context=args.context, device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                torch=torch.__version__, command=" ".join(sys.argv))
    print(f"# One step profiled: {args.shape}, {args.dtype}, {args.kernel}{', exact' if args.exact else ''}, "
          f"{args.batch} x {args.tokens} tokens, "
          f"context {args.context}, {head['device']} (per forward, mean of {args.steps}; the profiler adds host time)")
    print("\n| run | host ms | device ms | launches |\n|---|---:|---:|---|")
    for name, r in rows.items():
        launches = ", ".join(f"{k} {v:.0f}" for k, v in r["launches"].items()) or "-"
        print(f"| {name} | {r['host_ms']:.2f} | {r['device_ms']:.2f} | {launches} |")
    for name, r in rows.items():
        print(f"\n## {name}: ops by host time\n\n| op | calls | host us |\n|---|---:|---:|")
        for t in r["top"][:args.top]:
            print(f"| {t['op']} | {t['calls']:.0f} | {t['host_us']:.0f} |")
    res = dict(header=head, rows={k: {**v, "top": v["top"][:args.top]} for k, v in rows.items()})
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "profile_step.json").write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
