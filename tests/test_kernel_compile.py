"""Compile every kernel for real GPUs (sm_80, sm_90) on a machine without one.

The interpreter runs kernels as numpy and accepts code the GPU compiler rejects (type changes
of loop-carried values, unsupported constructs) -- and the reverse. Compiling ahead of time
through Triton's NVIDIA backend needs no driver and catches the first kind here. Runs in a
subprocess because kernels decorated under TRITON_INTERPRET=1 cannot be compiled.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import itertools, sys
    import torch, triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from kernels import elementwise as ew, exact_linear as el, kv_ops, ngram_match as ng, norm, tree_attention as ta

    def compile_(fn, types, constexprs, target, num_warps=4):
        sig = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in fn.arg_names}
        cx = {(fn.arg_names.index(n),): v for n, v in constexprs.items()}
        triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cx), target=target,
                       options={"num_warps": num_warps, "num_stages": 2})

    full = sys.argv[1] == "full"
    TT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
    # every code path once: split decode + per-sequence flags + window, prefill, all-masked tree
    quick = [(torch.bfloat16, (1, 4, 128), 2, True, 4), (torch.float16, (64, 1, 64), 0, False, 1),
             (torch.float16, (128, 2, 64), 1, False, 1)]
    # full: every dtype x tile shape x mask mode on sm_90 (the window only with per-sequence flags)
    every = [(dt, shape, mode, mode == 2, 4 if shape[0] == 1 else 1) for dt, shape, mode in itertools.product(
        TT, [(1, 4, 128), (64, 1, 64), (300, 2, 128), (1, 16, 96)], [0, 1, 2])]
    for cap in ((80, 90) if full else (90,)):
        target = GPUTarget("cuda", cap, 32)
        for dtype, (T, group, D), mode, window, splits in (every if full and cap == 90 else quick):
            block_d = max(16, triton.next_power_of_2(D))
            bm, bn, warps = ta._tile_config(T, group, block_d, dtype)
            types = {n: "*" + TT[dtype] for n in ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr")}
            types.update({n: "*i32" for n in ("cu_seqlens_ptr", "positions_ptr", "block_tables_ptr",
                                              "context_lens_ptr", "mask_ptr")})
            types.update(causal_ptr="*i8", sm_scale_log2="fp32", o_part_ptr="*fp32", lse_part_ptr="*fp32",
                         order_ptr="*i32", count_ptr="*i32")
            compile_(ta._tree_attention_kernel, types, dict(
                NUM_SPLITS=splits, GROUP=group, TOKENS_PER_TILE=bm // group, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d,
                MASK_MODE=mode, HAS_WINDOW=window, UPCAST_DOT=False,
                DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32", EXACT=False), target, warps)
            # the exact mode: its own tile, no splits, one step token per program under a mask
            bm, bn, warps = ta._exact_tile_config(group, block_d, dtype)
            compile_(ta._tree_attention_kernel, types, dict(
                NUM_SPLITS=1, GROUP=group, TOKENS_PER_TILE=bm // group if mode == 0 else 1, BLOCK_M=bm, BLOCK_N=bn,
                BLOCK_D=block_d, MASK_MODE=mode, HAS_WINDOW=window, UPCAST_DOT=False,
                DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32", EXACT=True), target, warps)
            if splits > 1:
                compile_(ta._merge_splits_kernel, {"o_part_ptr": "*fp32", "lse_part_ptr": "*fp32",
                         "out_ptr": "*" + TT[dtype], "cu_seqlens_ptr": "*i32"},
                         dict(NUM_SPLITS=splits, SPLITS_PAD=triton.next_power_of_2(splits), BLOCK_D=block_d), target)
        for has_causal, block in ((True, 32), (False, 1024)):
            compile_(ta._step_order_kernel, {"mask_ptr": "*i32", "cu_seqlens_ptr": "*i32", "causal_ptr": "*i8",
                     "order_ptr": "*i32", "count_ptr": "*i32"}, dict(HAS_CAUSAL=has_causal, BLOCK=block), target)
        # the plain product, then the exact path's fused forms: the norm in the prologue (a layer's,
        # the head's with fp32 out), silu * up in the prologue and the residual in the epilogue
        for dtype, bias, out, fused in ((torch.bfloat16, True, "bf16", ()), (torch.bfloat16, False, "fp32", ()),
                                        (torch.float16, False, "fp16", ()), (torch.float32, True, "fp32", ()),
                                        (torch.bfloat16, True, "bf16", ("NORM",)),
                                        (torch.bfloat16, False, "fp32", ("NORM",)),
                                        (torch.bfloat16, False, "bf16", ("SILU", "RESIDUAL")),
                                        (torch.float32, False, "fp32", ("NORM", "RESIDUAL"))):
            bm, bn, bk = el.TILE[dtype]
            dt = TT[dtype]
            compile_(el._linear_kernel, {"x_ptr": "*" + dt, "w_ptr": "*" + dt, "b_ptr": "*" + dt, "out_ptr": "*" + out,
                                         "nw_ptr": "*" + dt, "res_ptr": "*" + out, "eps": "fp32"},
                     dict(HAS_BIAS=bias, NORM="NORM" in fused, SILU="SILU" in fused, RESIDUAL="RESIDUAL" in fused,
                          BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, UPCAST_DOT=False,
                          DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32"), target)
        for dt in ("fp32", "bf16"):
            compile_(kv_ops._kv_store_kernel, {"k_ptr": "*" + dt, "v_ptr": "*" + dt, "k_cache_ptr": "*" + dt,
                     "v_cache_ptr": "*" + dt, "slot_mapping_ptr": "*i64"}, dict(BLOCK=1024), target)
            compile_(kv_ops._kv_compact_kernel, {"k_cache_ptr": "*" + dt, "v_cache_ptr": "*" + dt,
                     **{n: "*i32" for n in ("block_tables_ptr", "context_lens_ptr", "accept_idx_ptr",
                                            "accept_counts_ptr")}}, dict(BLOCK=512), target)
        for dt, res, block in (("fp32", False, 1024), ("bf16", True, 4096), ("fp16", True, 64)):
            compile_(norm._rms_norm_kernel, {n: "*" + dt for n in ("x_ptr", "res_ptr", "w_ptr", "out_ptr", "h_ptr")}
                     | {"eps": "fp32"}, dict(HAS_RES=res, BLOCK=block), target, 8 if block > 2048 else 4)
        for dt, block in (("fp32", 64), ("bf16", 32), ("fp16", 8)):
            compile_(ew._rope_kernel, {n: "*" + dt for n in ("x_ptr", "cos_ptr", "sin_ptr")}, dict(BLOCK=block), target)
            compile_(ew._silu_mul_kernel, {"gu_ptr": "*" + dt, "out_ptr": "*" + dt}, dict(BLOCK=1024), target)
            compile_(kv_ops._rope_store_kernel, {n: "*" + dt for n in ("x_ptr", "cos_ptr", "sin_ptr", "k_cache_ptr",
                                                                       "v_cache_ptr")} | {"slot_mapping_ptr": "*i64"},
                     dict(BLOCK=block), target)
        ng_cases = itertools.product(("*i32", "*i64"), (1, 3), (False, True), (False, True)) if full else [
            ("*i64", 1, False, False), ("*i32", 3, True, True)]
        for it, nc, recent, partial in ng_cases:
            compile_(ng._ngram_match_kernel, {"tokens_ptr": it, "cu_seqlens_ptr": "*i32", "cands_ptr": it,
                     "lens_ptr": "*i32"}, dict(NUM_CAND=nc, NC_PAD=triton.next_power_of_2(nc),
                     PREFER_RECENT=recent, PARTIAL=partial, BLOCK=256, BLOCK_K=16), target)
    print("compiled")
""")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel tests compile and run the kernels")
@pytest.mark.parametrize("scope", ["quick", pytest.param("full", marks=pytest.mark.slow)])
def test_kernels_compile_for_gpus(scope):
    """quick: sm_90, every code path once (~15 s); full: every dtype / tile shape / mask mode on
    sm_90 and the quick set on sm_80 (several minutes)."""
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.backends.nvidia import compiler  # noqa: F401
    except ImportError as e:
        pytest.skip(f"Triton's NVIDIA backend is not installed: {e}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", SCRIPT, scope], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=1800)
    assert res.returncode == 0 and "compiled" in res.stdout, res.stderr[-4000:]
