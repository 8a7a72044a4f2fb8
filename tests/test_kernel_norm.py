"""rms_norm (Triton) against rms_norm_ref: random rows of odd widths, strided rows, a residual,
three dtypes, and bad inputs."""

import pytest
import torch

from kernels.backend import triton_interpreted
from kernels.norm import rms_norm, rms_norm_ref

# fp32: the row's sum is ordered differently; 16-bit: one rounding step of the result (the
# CPU interpreter also truncates instead of rounding when it casts fp32 to bf16)
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float16: dict(rtol=2e-3, atol=1e-3),
       torch.bfloat16: dict(rtol=1.6e-2, atol=8e-3)}


def rows(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("n_rows, n", [(1, 64), (5, 96), (3, 576), (7, 33), (2, 1)])
def test_rms_norm_matches_ref(dtype, n_rows, n):
    x, w = rows((n_rows, n), dtype, n), rows((n,), dtype, n + 1) + 1
    torch.testing.assert_close(rms_norm(x, w, 1e-5), rms_norm_ref(x, w, 1e-5), **TOL[dtype])


@pytest.mark.parametrize("dtype", list(TOL))
def test_residual_add_then_norm(dtype):
    x, r, w = rows((6, 200), dtype, 1, 3.0), rows((6, 200), dtype, 2), rows((200,), dtype, 3)
    h, out = rms_norm(x, w, 1e-6, residual=r)
    h_ref, out_ref = rms_norm_ref(x, w, 1e-6, residual=r)
    if dtype == torch.bfloat16 and triton_interpreted():  # the interpreter truncates to bf16
        torch.testing.assert_close(h, h_ref, rtol=2 ** -7, atol=0)
    else:
        assert torch.equal(h, h_ref)  # the sum is one rounding of the fp32 sum, as torch's
    torch.testing.assert_close(out, out_ref, **TOL[dtype])


def test_strided_rows_and_empty_input():
    big = rows((4, 300), torch.float32, 4)
    x, r = big[:, :128], big[:, 150:278]  # rows 300 apart
    w = rows((128,), torch.float32, 5)
    torch.testing.assert_close(rms_norm(x, w, 1e-5), rms_norm_ref(x, w, 1e-5), rtol=1e-5, atol=1e-6)
    h, out = rms_norm(x, w, 1e-5, residual=r)
    torch.testing.assert_close(out, rms_norm_ref(x, w, 1e-5, residual=r)[1], rtol=1e-5, atol=1e-6)
    assert rms_norm(torch.zeros(0, 8), torch.ones(8), 1e-5).shape == (0, 8)


@pytest.mark.parametrize("bad, match", [
    (dict(x=torch.zeros(8)), "2-D"),
    (dict(x=torch.zeros(2, 8, dtype=torch.int32)), "float32"),
    (dict(x=torch.zeros(8, 2).t()), "stride"),
    (dict(weight=torch.ones(7)), "weight"),
    (dict(weight=torch.ones(8, dtype=torch.float16)), "weight"),
    (dict(residual=torch.zeros(2, 7)), "residual"),
])
def test_bad_inputs(bad, match):
    args = {**dict(x=torch.zeros(2, 8), weight=torch.ones(8), residual=None), **bad}
    with pytest.raises(ValueError, match=match):
        rms_norm(args["x"], args["weight"], 1e-5, residual=args["residual"])


def test_the_model_with_fused_ops_gives_the_same_logits_and_tokens():
    """The forward with one launch per norm (what the Triton backend does on a GPU) against the
    torch ops, on a tiny model through the interpreter: logits, and greedy tokens of a method
    with tree steps."""
    from decoding import generate, make_proposer
    from helpers import tiny_hf_model
    from kernels.backend import TritonBackend, get_backend
    from models.loader import from_hf

    dev = torch.empty(0).device  # the GPU where the kernel tests run there (conftest), else the CPU
    model = from_hf(tiny_hf_model("llama", seed=3), backend=get_backend("triton", dev), device=dev).model
    assert isinstance(model.backend, TritonBackend)
    prompt = [5, 6, 7, 8, 5, 6, 7, 9, 1, 2, 3]
    outs, logits = {}, {}
    saved = model.backend.fused_ops
    try:
        for fused in (False, True):
            model.backend.fused_ops = fused
            from models.runner import ModelRunner, StepInput
            r = ModelRunner(model, cache_tokens=64, block_size=4)
            r.add_sequence(0)
            logits[fused] = r.step([StepInput(0, prompt)])[0]
            outs[fused] = generate(model, [prompt], make_proposer("lookahead+pld"), max_new_tokens=8,
                                   eos_token_ids=())[0].output_ids
    finally:
        model.backend.fused_ops = saved
    torch.testing.assert_close(logits[True], logits[False], rtol=1e-5, atol=1e-5)
    assert outs[True] == outs[False]
