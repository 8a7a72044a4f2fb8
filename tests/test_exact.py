"""The exact path (``--exact``, ``get_backend("triton", exact=True)``) on a tiny bf16 model:
every product goes to kernels/exact_linear.py, a row's logits are bit for bit those of the
decoding step that holds it (in a tree step, in a padded CUDA-graph step), and every method's
greedy output is ``ar``'s. Under the CPU interpreter (the dots are numpy's) these are necessary,
not sufficient: the GPU session runs the kernels' own tests natively (bench/gpu_session.sh).
"""

import os

import pytest
import torch

from decoding import generate
from helpers import tiny_hf_model
from kernels.backend import TritonBackend, get_backend
from models.linear import EXACT_PLAN, Linear
from models.loader import from_hf
from models.runner import ModelRunner, StepInput
from models.tune import describe, tune_model

GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
DEVICE = "cuda" if GPU else "cpu"


def exact_model(arch="llama", dtype=torch.bfloat16):
    return from_hf(tiny_hf_model(arch, seed=3), backend=get_backend("triton", DEVICE, exact=True), dtype=dtype,
                   device=DEVICE).model


@pytest.fixture(scope="module")
def tiny_exact():
    return exact_model()


def test_every_product_and_the_head_take_the_exact_kernel(tiny_exact, tmp_path):
    lins = [m for m in tiny_exact.modules() if isinstance(m, Linear)]
    assert lins and all(m.plan is EXACT_PLAN for m in lins) and tiny_exact.head_plan is EXACT_PLAN
    assert tune_model(tiny_exact, tmp_path) == {} and all(m.plan is EXACT_PLAN for m in lins)  # nothing tuned
    assert describe(tiny_exact).startswith("exact")
    assert tiny_exact.backend.fused_ops and tiny_exact.head_screen() is None  # per-row kernels; fp32 logits
    h = torch.randn(3, tiny_exact.cfg.hidden_size).to(tiny_exact.device, tiny_exact.dtype)
    assert tiny_exact.head(h).dtype == torch.float32


@pytest.mark.parametrize("arch", ["qwen2", "llama"])  # qwen2: the qkv product's bias
def test_the_fused_exact_layer_computes_the_models_forward(arch, monkeypatch):
    """The exact path's layer (norms, silu * up and residuals fused into its products, RoPE with
    the K/V store): six launches a layer, none of the separate small kernels, and in fp32 the
    torch backend's logits (the same model, the reference forward) to fp32's rounding, over a
    prefill, a tree step and a decoding step."""
    import kernels.exact_linear as el
    from kernels import elementwise, kv_ops

    hf = tiny_hf_model(arch, seed=3)
    exact = from_hf(hf, backend=get_backend("triton", DEVICE, exact=True), dtype=torch.float32, device=DEVICE).model
    ref = from_hf(hf, backend=get_backend("torch"), dtype=torch.float32).model
    calls = {"fused": 0, "rope_store": 0}
    real_linear, real_store = el.exact_linear, kv_ops.rope_store

    def counted_linear(*a, **kw):
        calls["fused"] += any(kw.get(k) is not None and kw.get(k) is not False for k in ("norm", "silu", "residual"))
        return real_linear(*a, **kw)

    def counted_store(*a, **kw):
        calls["rope_store"] += 1
        return real_store(*a, **kw)

    def refused(*a, **kw):
        raise AssertionError("a separate small kernel on the exact path")

    import models.llama as llama
    monkeypatch.setattr(llama, "exact_linear", counted_linear)
    monkeypatch.setattr(kv_ops, "rope_store", counted_store)
    for mod, name in ((llama, "fused_rms_norm"), (elementwise, "silu_mul"), (elementwise, "rope"),
                      (kv_ops, "kv_store")):
        monkeypatch.setattr(mod, name, refused)
    prompt, tokens, parents = [5, 6, 7, 8, 5, 6, 7, 9, 11], [9, 3, 4, 5], [-1, 0, 0, 1]
    a, b = _prefilled(exact, prompt), _prefilled(ref, prompt)
    layers = exact.cfg.num_layers
    assert calls == {"fused": 4 * layers + 1, "rope_store": layers}  # 4 products a layer, the head
    for step in ([StepInput(0, tokens, depths=[0, 1, 1, 2], parents=parents)], [StepInput(0, [9])]):
        torch.testing.assert_close(a.step(step)[0], b.step(step)[0], rtol=1e-4, atol=1e-4)
        a.commit({0: [0]})
        b.commit({0: [0]})


def _prefilled(model, prompt):
    runner = ModelRunner(model, cache_tokens=256, block_size=4)
    runner.add_sequence(0)
    runner.step([StepInput(0, prompt[:-1])])
    runner.commit({0: list(range(len(prompt) - 1))})
    return runner


@pytest.mark.parametrize("arch", ["qwen2", "llama"])  # qwen2: the qkv product's bias
def test_a_tree_rows_logits_are_its_decoding_steps(arch):
    """A tree step's rows against plain decoding along the accepted path, bf16: the same bits,
    and after the path is committed (its K/V moved by the compaction) the next step too."""
    model = exact_model(arch)
    prompt = [5, 6, 7, 8, 5, 6, 7, 9, 11]
    tokens, parents = [9, 3, 4, 5, 6, 7, 8], [-1, 0, 0, 1, 1, 3, 2]  # root 9; path 9 -> 3 -> 5 -> 7
    path = [0, 1, 3, 5]
    tree = _prefilled(model, prompt)
    rows = tree.step([StepInput(0, tokens, depths=[0, 1, 1, 2, 2, 3, 2], parents=parents)])[0]
    tree.commit({0: path})
    after_tree = tree.step([StepInput(0, [1])])[0]
    plain = _prefilled(model, prompt)
    for r in path:
        one = plain.step([StepInput(0, [tokens[r]])])[0]
        assert torch.equal(one[0], rows[r]), (arch, r, (one[0] - rows[r]).abs().max())
        plain.commit({0: [0]})
    assert torch.equal(plain.step([StepInput(0, [1])])[0], after_tree)


# the padding rows' attention output is never written (they belong to no sequence), so their
# products multiply whatever memory held: numpy warns of overflow there; they are never returned
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_a_padded_graph_step_gives_the_unpadded_bits(tiny_exact):
    """CUDA graphs pad a step's rows, batch and max_seqlen_q (models/graphs.py); on the exact
    path that changes no bit (``capture=False`` runs the padded step eagerly)."""
    from test_graphs import _runner, _steps

    eager, padded = _runner(tiny_exact, False), _runner(tiny_exact, True)
    for step in _steps():
        for w, g in zip(eager.step(step), padded.step(step)):
            assert torch.equal(g, w)
        eager.commit({inp.seq_id: [0] for inp in step})
        padded.commit({inp.seq_id: [0] for inp in step})


PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 9], [1, 2, 3, 1, 2, 3, 1, 2, 3, 4, 5, 6, 1, 2, 3, 11, 12], [40]]


@pytest.fixture(scope="module")
def plain_outputs(tiny_exact):
    return [generate(tiny_exact, [p], max_new_tokens=8, eos_token_ids=())[0].output_ids for p in PROMPTS]


# hybrid: every draft source's trees and a private lookahead window beside them (small configs);
# pld: chains
@pytest.mark.parametrize("name", ["hybrid", "pld"])
def test_bf16_greedy_drafts_give_ars_tokens(tiny_exact, plain_outputs, name):
    """bf16, a ragged batch of three prompts: the method's tokens are plain greedy decoding's,
    and some of its drafts were accepted (fewer forwards than tokens)."""
    from test_decoding import proposer

    res = generate(tiny_exact, PROMPTS, proposer(name, tiny_exact, small=True), max_new_tokens=8, eos_token_ids=())
    assert [r.output_ids for r in res] == plain_outputs
    assert sum(r.stats.forwards for r in res) < sum(len(r.output_ids) for r in res)


def test_the_exact_path_needs_the_triton_backend_and_unquantized_weights(monkeypatch):
    with pytest.raises(ValueError, match="--kernel triton"):
        get_backend("torch", exact=True)
    with pytest.raises(ValueError, match="exact must be"):
        TritonBackend(exact=1)
    from models.loader import resolve_weights
    with pytest.raises(ValueError, match="exact path"):
        resolve_weights("q8_0", torch.float32, torch.device("cpu"), exact=True)
    assert resolve_weights(None, torch.float32, torch.device("cpu"), gguf=True, exact=True) == "fp32"
    monkeypatch.setenv("SPECDEC_FUSED", "0")
    with pytest.raises(ValueError, match="SPECDEC_FUSED"):
        TritonBackend(exact=True)


@pytest.mark.parametrize("argv, match", [
    (["hi", "--exact", "--kernel", "torch"], "--exact runs on the Triton kernels"),
    (["hi", "--exact", "--kernel", "triton", "--weights", "q8_0"], "--weights"),
])
def test_cli_refuses_exact_where_it_cannot_run(argv, match, capsys):
    from decoding.cli import parse_args

    with pytest.raises(SystemExit):
        parse_args(argv)
    assert match in capsys.readouterr().err
