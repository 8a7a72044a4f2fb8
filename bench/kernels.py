"""Microbenchmark of the Triton kernels against their torch references.

    python bench/kernels.py            # realistic sizes on a GPU; tiny interpreted ones on CPU
    python bench/kernels.py --quick    # tiny sizes everywhere

Every kernel is first checked against its reference on the benchmark inputs, then timed
(median; ``triton.testing.do_bench`` on a GPU). Attention is also compared with two dense
baselines that do NOT read the paged cache:
  * flex  -- ``torch.nn.attention.flex_attention`` (torch.compile'd on a GPU) with a BlockMask
             built from a mask_mod that encodes the same visibility (prefix + step rule);
  * sdpa  -- ``F.scaled_dot_product_attention`` with an explicit bool mask.
Both run on K/V already gathered into a padded contiguous (B, n_kv, L_max, D) layout and on
queries padded to (B, H, T_max, D); the gather and padding are not timed, so they are a lower
bound for a paged layout. GB/s counts the K/V bytes attention must read (every key once per
KV head), or bytes read + written for the KV copies.

Without a GPU the kernels run in Triton's interpreter (numpy): the timings then only show that
the code runs; they say nothing about GPU speed and none are reported as such.
"""

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

if not torch.cuda.is_available():
    # Triton decides when a kernel is decorated whether it is interpreted: before `kernels`.
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

from kernels.kv_ops import kv_compact, kv_compact_ref, kv_store, kv_store_ref  # noqa: E402
from kernels.mask import pack_mask  # noqa: E402
from kernels.ngram_match import ngram_match, ngram_match_lists, ngram_match_ref  # noqa: E402
from kernels.norm import rms_norm, rms_norm_ref  # noqa: E402
from kernels.tree_attention import tree_attention, tree_attention_ref  # noqa: E402

# (B, prefix C, step T, rule) per attention case; heads (H, n_kv, D); others per kernel.
SIZES = {
    "full": dict(
        heads=(32, 8, 128), block_size=16,
        ngram=dict(B=64, L_min=1024, L_max=8192),
        kv_store=dict(T=512), kv_compact=dict(layers=32, B=32, A=8, C=500),
        rms_norm=[(1, 4096), (64, 4096), (4096, 4096)],  # (rows, hidden): decode, a tree step, prefill
        # The last field forces num_kv_splits (None = the launcher's occupancy heuristic).
        attention=[("decode", 16, 4096, 1, "causal", None), ("decode", 4, 16384, 1, "causal", None),
                   ("decode, no split-KV", 4, 16384, 1, "causal", 1),
                   ("tree", 8, 2048, 64, "tree", None), ("prefill", 2, 0, 2048, "causal", None)],
    ),
    "tiny": dict(
        heads=(4, 2, 64), block_size=16,
        ngram=dict(B=4, L_min=64, L_max=256),
        kv_store=dict(T=16), kv_compact=dict(layers=2, B=4, A=4, C=40),
        rms_norm=[(1, 64), (5, 96)],
        attention=[("decode", 2, 256, 1, "causal", None), ("decode, 3 KV splits", 2, 256, 1, "causal", 3),
                   ("tree", 2, 128, 16, "tree", None), ("prefill", 1, 0, 64, "causal", None)],
    ),
}


def timer(device: torch.device):
    def run(fn) -> float:
        if device.type == "cuda":
            return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        fn()  # warm-up
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3
    return run


# ---- inputs ---------------------------------------------------------------------------------

def paged_batch(seqs, heads, block_size, dtype, device, g):
    """seqs: [(C, T, rule)]. A shuffled pool 25% larger than needed, like a busy server's."""
    H, KV, D = heads
    B = len(seqs)
    need = [-(-(C + T) // block_size) for C, T, _ in seqs]
    num_blocks = sum(need) * 5 // 4 + 1
    perm = torch.randperm(num_blocks, generator=g)
    block_tables = torch.full((B, max(need)), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(need):
        block_tables[b, :n] = perm[used:used + n].to(torch.int32)
        used += n
    step_vis, positions = [], []
    for C, T, rule in seqs:
        if rule == "tree":
            parent = [-1] + [int(torch.randint(max(0, i - 4), i, (1,), generator=g)) for i in range(1, T)]
            vis = torch.zeros(T, T, dtype=torch.bool)
            depth = [0] * T
            for i, p in enumerate(parent):
                if p >= 0:
                    vis[i], depth[i] = vis[p], depth[p] + 1
                vis[i, i] = True
            positions.append(C + torch.tensor(depth))
        else:
            vis = torch.ones(T, T, dtype=torch.bool).tril()
            positions.append(torch.arange(C, C + T))
        step_vis.append(vis)
    tree = any(r == "tree" for _, _, r in seqs)
    mask = causal = None
    if tree:
        words = max(-(-T // 32) for _, T, _ in seqs)
        packed = [pack_mask(v) for v in step_vis]
        mask = torch.cat([F.pad(m, (0, words - m.shape[1])) for m in packed])
        causal = torch.tensor([r != "tree" for _, _, r in seqs])
    T_total = sum(T for _, T, _ in seqs)
    cu = torch.tensor([0] + [T for _, T, _ in seqs]).cumsum(0).to(torch.int32)
    to = dict(device=device)
    return dict(
        q=torch.randn(T_total, H, D, generator=g).to(dtype=dtype, **to),
        k_cache=torch.randn(num_blocks, block_size, KV, D, generator=g).to(dtype=dtype, **to),
        v_cache=torch.randn(num_blocks, block_size, KV, D, generator=g).to(dtype=dtype, **to),
        cu_seqlens_q=cu.to(**to), positions=torch.cat(positions).to(torch.int32).to(**to),
        block_tables=block_tables.to(**to), context_lens=torch.tensor([C for C, _, _ in seqs], dtype=torch.int32, **to),
        mask=None if mask is None else mask.to(**to), causal=None if causal is None else causal.to(**to),
    ), step_vis


def dense_layout(a, seqs, step_vis):
    """Padded contiguous copies for flex / SDPA: q (B, H, Tm, D), k / v (B, KV, Lm, D), vis (B, Tm, Lm)."""
    dev, bs = a["q"].device, a["k_cache"].shape[1]
    B, Tm, Lm = len(seqs), max(T for _, T, _ in seqs), max(C + T for C, T, _ in seqs)
    H, D = a["q"].shape[1:]
    KV = a["k_cache"].shape[2]
    q = torch.zeros(B, Tm, H, D, dtype=a["q"].dtype, device=dev)
    k = torch.zeros(B, Lm, KV, D, dtype=a["q"].dtype, device=dev)
    v = torch.zeros_like(k)
    vis = torch.zeros(B, Tm, Lm, dtype=torch.bool, device=dev)
    step = torch.zeros(B, Tm, Tm, dtype=torch.bool, device=dev)
    cu = a["cu_seqlens_q"].tolist()
    for b, (C, T, _) in enumerate(seqs):
        q[b, :T] = a["q"][cu[b]:cu[b + 1]]
        blocks = a["block_tables"][b, :-(-(C + T) // bs)].long()
        k[b, :C + T] = a["k_cache"][blocks].flatten(0, 1)[:C + T]
        v[b, :C + T] = a["v_cache"][blocks].flatten(0, 1)[:C + T]
        vis[b, :T, :C] = True
        vis[b, :T, C:C + T] = step_vis[b].to(dev)
        step[b, :T, :T] = step_vis[b].to(dev)
    ctx = torch.tensor([C for C, _, _ in seqs], device=dev)
    lens = torch.tensor([T for _, T, _ in seqs], device=dev)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), vis, step, ctx, lens


def packed_rows(out_padded, seqs):
    """(B, H, Tm, D) -> (T_total, H, D), dropping padding rows."""
    return torch.cat([out_padded[b, :, :T].transpose(0, 1) for b, (_, T, _) in enumerate(seqs)])


# ---- cases ----------------------------------------------------------------------------------

def bench_attention(name, seqs, splits, sz, dtype, device, g, time_fn):
    a, step_vis = paged_batch(seqs, sz["heads"], sz["block_size"], dtype, device, g)
    max_T = max(T for _, T, _ in seqs)
    out = tree_attention(**a, max_seqlen_q=max_T, num_kv_splits=splits)
    ref = tree_attention_ref(**a)
    err = (out.float() - ref.float()).abs().max().item()
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    if not err <= tol:
        raise AssertionError(f"tree_attention {name}: max error {err:.3g} vs reference exceeds {tol}")
    row = dict(triton=time_fn(lambda: tree_attention(**a, max_seqlen_q=max_T, num_kv_splits=splits)),
               ref=time_fn(lambda: tree_attention_ref(**a)))

    q, k, v, vis, step, ctx, lens = dense_layout(a, seqs, step_vis)
    try:
        row["sdpa"] = _check_dense(F.scaled_dot_product_attention(q, k, v, attn_mask=vis[:, None], enable_gqa=True),
                                   seqs, ref, tol, time_fn,
                                   lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=vis[:, None],
                                                                          enable_gqa=True))
    except Exception as e:  # noqa: BLE001 -- a baseline that cannot run is reported, not fatal
        row["sdpa"] = f"n/a ({type(e).__name__})"
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        Tm, Lm = step.shape[1], vis.shape[2]

        def mask_mod(b, h, q_idx, kv_idx):
            s = kv_idx - ctx[b]
            in_step = (s >= 0) & (s < lens[b]) & step[b, q_idx, s.clamp(0, Tm - 1)]
            return (q_idx < lens[b]) & ((kv_idx < ctx[b]) | in_step)

        block_mask = create_block_mask(mask_mod, len(seqs), None, Tm, Lm, device=device)
        flex = torch.compile(flex_attention, dynamic=False) if device.type == "cuda" else flex_attention
        row["flex"] = _check_dense(flex(q, k, v, block_mask=block_mask, enable_gqa=True), seqs, ref, tol, time_fn,
                                   lambda: flex(q, k, v, block_mask=block_mask, enable_gqa=True))
    except Exception as e:  # noqa: BLE001
        row["flex"] = f"n/a ({type(e).__name__})"

    H, KV, D = sz["heads"]
    kv_bytes = sum(C + T for C, T, _ in seqs) * KV * D * 2 * a["k_cache"].element_size()
    row["gbps"] = kv_bytes / (row["triton"] * 1e-3) / 1e9
    C, T, rule = seqs[0]
    return dict(kernel="tree_attention", case=f"{name}: B={len(seqs)} C={C} T={T} ({rule})", err=err, **row)


def _check_dense(out_padded, seqs, ref, tol, time_fn, fn):
    err = (packed_rows(out_padded, seqs).float() - ref.float()).abs().max().item()
    if not err <= tol:
        raise AssertionError(f"dense baseline disagrees with the reference: {err:.3g}")
    return time_fn(fn)


def bench_ngram(sz, device, g, time_fn):
    B, lo, hi = sz["B"], sz["L_min"], sz["L_max"]
    hist = []
    for b in range(B):
        L = int(torch.randint(lo, hi + 1, (1,), generator=g))
        h = torch.randint(0, 2000, (L,), generator=g)
        # Text repeats itself: the last tokens recur earlier (at a random place) in most histories.
        if b % 4:
            j = int(torch.randint(0, L // 2, (1,), generator=g))
            h[-3:] = h[j:j + 3]
        hist.append(h)
    tokens = torch.cat(hist).to(device)
    cu = torch.tensor([0] + [len(h) for h in hist]).cumsum(0).to(torch.int32).to(device)
    kw = dict(min_n=1, max_n=3, k=10)
    got, want = ngram_match(tokens, cu, **kw), ngram_match_ref(tokens, cu, **kw)
    if not (torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])):
        raise AssertionError("ngram_match disagrees with the reference")
    lists = [h.tolist() for h in hist]  # the torch backend's host search reads the histories as lists
    if ngram_match_lists(lists, **kw) != [[c[:n] for c, n in zip(rows, ns) if n] for rows, ns in
                                          zip(want[0].tolist(), want[1].tolist())]:
        raise AssertionError("ngram_match_lists disagrees with the reference")
    return dict(kernel="ngram_match", case=f"B={B}, L={lo}..{hi}, max_n=3, k=10", err=0.0,
                triton=time_fn(lambda: ngram_match(tokens, cu, **kw)),
                ref=time_fn(lambda: ngram_match_ref(tokens, cu, **kw)),
                host=time_fn(lambda: ngram_match_lists(lists, **kw)))


def bench_kv_store(sz, heads, block_size, dtype, device, g, time_fn):
    _, KV, D = heads
    T = sz["T"]
    num_blocks = 4 * -(-T // block_size) + 8
    kc = torch.randn(num_blocks, block_size, KV, D, generator=g).to(dtype=dtype, device=device)
    vc = torch.randn_like(kc)
    k = torch.randn(T, KV, D, generator=g).to(dtype=dtype, device=device)
    v = torch.randn_like(k)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:T].to(device)
    a, b = kc.clone(), vc.clone()
    kv_store(a, b, k, v, slots)
    kv_store_ref(kc, vc, k, v, slots)
    if not (torch.equal(a, kc) and torch.equal(b, vc)):
        raise AssertionError("kv_store disagrees with the reference")
    moved = 2 * 2 * T * KV * D * kc.element_size()  # K and V, read + write
    t = time_fn(lambda: kv_store(kc, vc, k, v, slots))
    return dict(kernel="kv_store", case=f"T={T} tokens, 1 layer", err=0.0, triton=t,
                ref=time_fn(lambda: kv_store_ref(kc, vc, k, v, slots)), gbps=moved / (t * 1e-3) / 1e9)


def bench_kv_compact(sz, heads, block_size, dtype, device, g, time_fn):
    _, KV, D = heads
    layers, B, A, C = sz["layers"], sz["B"], sz["A"], sz["C"]
    per_seq = -(-(C + 4 * A) // block_size)
    num_blocks = B * per_seq + 8
    shape = (layers, num_blocks, block_size, KV, D)
    kc = torch.randn(shape, generator=g).to(dtype=dtype, device=device)
    vc = torch.randn_like(kc)
    bt = torch.randperm(num_blocks, generator=g)[:B * per_seq].view(B, per_seq).to(torch.int32).to(device)
    ctx = torch.full((B,), C, dtype=torch.int32, device=device)
    # Accepted tokens: a sorted random subset of a 4A-token step.
    idx = torch.stack([torch.randperm(4 * A, generator=g)[:A].sort().values for _ in range(B)]).to(torch.int32)
    counts = torch.randint(1, A + 1, (B,), generator=g).to(torch.int32)
    moved_rows = int(sum(int((idx[b, :counts[b]] != torch.arange(counts[b])).sum()) for b in range(B)))
    idx, counts = idx.to(device), counts.to(device)
    a, b = kc.clone(), vc.clone()
    kv_compact(a, b, bt, ctx, idx, counts)
    kv_compact_ref(kc, vc, bt, ctx, idx, counts)
    if not (torch.equal(a, kc) and torch.equal(b, vc)):
        raise AssertionError("kv_compact disagrees with the reference")
    t = time_fn(lambda: kv_compact(kc, vc, bt, ctx, idx, counts))
    moved = 2 * 2 * moved_rows * layers * KV * D * kc.element_size()
    return dict(kernel="kv_compact", case=f"{layers} layers, B={B}, up to {A} accepted", err=0.0, triton=t,
                ref=time_fn(lambda: kv_compact_ref(kc, vc, bt, ctx, idx, counts)), gbps=moved / (t * 1e-3) / 1e9)


def bench_rms_norm(rows_n, dtype, device, g, time_fn):
    rows, n = rows_n
    x = torch.randn(rows, n, generator=g).to(dtype=dtype, device=device)
    r = torch.randn(rows, n, generator=g).to(dtype=dtype, device=device)
    w = (torch.randn(n, generator=g) + 1).to(dtype=dtype, device=device)
    h, out = rms_norm(x, w, 1e-5, residual=r)
    h_ref, out_ref = rms_norm_ref(x, w, 1e-5, residual=r)
    err = (out.float() - out_ref.float()).abs().max().item()
    # relative: a 16-bit result may differ by a rounding step of the normalised row and one of
    # the product (the CPU interpreter truncates bf16 instead of rounding)
    rtol = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    if not (torch.equal(h, h_ref) or (dtype == torch.bfloat16 and device.type != "cuda")) or \
            not torch.allclose(out.float(), out_ref.float(), rtol=rtol, atol=1e-5):
        raise AssertionError(f"rms_norm disagrees with the reference (max error {err:.3g}, rtol {rtol})")
    t = time_fn(lambda: rms_norm(x, w, 1e-5, residual=r))
    moved = 4 * rows * n * x.element_size()  # x and residual read, sum and output written
    return dict(kernel="rms_norm", case=f"{rows} rows x {n}, residual add", err=err, triton=t,
                ref=time_fn(lambda: rms_norm_ref(x, w, 1e-5, residual=r)), gbps=moved / (t * 1e-3) / 1e9)


# ---- report ---------------------------------------------------------------------------------

def fmt(x, spec):
    if x is None:
        return "-"
    return x if isinstance(x, str) else format(x, spec)


def print_table(rows, gpu: bool):
    cols = [("kernel", "kernel", "s"), ("case", "case", "s"), ("triton ms", "triton", ".3f"), ("ref ms", "ref", ".3f"),
            ("speedup", "speedup", ".1f"), ("host ms", "host", ".3f"), ("flex ms", "flex", ".3f"),
            ("sdpa ms", "sdpa", ".3f"),
            ("GB/s", "gbps", ".0f"), ("max err", "err", ".1e")]
    for r in rows:
        r["speedup"] = r["ref"] / r["triton"]
        if not gpu:  # interpreter timings: ratios and bandwidths would be meaningless
            r["speedup"] = r["gbps"] = None
    cells = [[fmt(r.get(key), spec) for _, key, spec in cols] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _, _) in enumerate(cols)]
    line = lambda vals: "  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(vals, widths)))  # noqa: E731
    print(line([h for h, _, _ in cols]))
    print(line(["-" * w for w in widths]))
    for c in cells:
        print(line(c))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes (always used without a GPU)")
    p.add_argument("--dtype", default="bf16", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    sz = SIZES["tiny" if args.quick or not gpu else "full"]
    if gpu:
        print(f"device: {torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} "
              f"| {args.dtype} | heads (H, KV, D) = {sz['heads']}")
    else:
        print("NO GPU: Triton kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1) at tiny sizes.\n"
              "These timings only show the benchmark runs; they are NOT GPU numbers and say nothing about\n"
              f"kernel speed. | torch {torch.__version__} | triton {triton.__version__} | {args.dtype} "
              f"| heads (H, KV, D) = {sz['heads']}")
    if not gpu:
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    g = torch.Generator().manual_seed(args.seed)
    time_fn = timer(device)
    rows = [bench_ngram(sz["ngram"], device, g, time_fn),
            bench_kv_store(sz["kv_store"], sz["heads"], sz["block_size"], dtype, device, g, time_fn),
            bench_kv_compact(sz["kv_compact"], sz["heads"], sz["block_size"], dtype, device, g, time_fn)]
    rows += [bench_rms_norm(rn, dtype, device, g, time_fn) for rn in sz["rms_norm"]]
    for name, B, C, T, rule, splits in sz["attention"]:
        rows.append(bench_attention(name, [(C, T, rule)] * B, splits, sz, dtype, device, g, time_fn))
    print_table(rows, gpu)
    print("flex / sdpa: dense baselines on pre-gathered, padded contiguous K/V (gather not timed); "
          "ref = the torch reference (what the `--kernel torch` backend runs; for ngram_match it runs the host "
          "search, `host`). Outputs checked against the reference first.")


if __name__ == "__main__":
    main()
