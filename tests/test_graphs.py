"""CUDA-graph replay of decoding steps (models/graphs.py).

Without a GPU the capture cannot run; ``capture=False`` runs the very padded step a graph
would replay (padded rows, empty sequences, wider block tables, bucketed max_seqlen_q and
logits rows) eagerly through the Triton kernels (under the interpreter on a CPU, natively on
a GPU), which is what these tests check against the unpadded forward. The capture itself runs
only where CUDA is present (the last tests).
"""

import os

import pytest
import torch

from decoding import HybridConfig, LookaheadConfig, generate, make_proposer
from helpers import ours_from_hf, tiny_hf_model
from kernels.backend import get_backend
from models.graphs import StepGraphs, StepShape, use_cuda_graphs
from models import packing
from models.loader import from_hf
from models.runner import ModelRunner, StepInput

GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
DEVICE = "cuda" if GPU else "cpu"  # where Triton runs natively, else the interpreter's CPU


def tiny_triton_model():
    return from_hf(tiny_hf_model("llama", seed=3), backend=get_backend("triton", DEVICE), device=DEVICE).model


@pytest.fixture(scope="module")
def tiny_triton():
    return tiny_triton_model()


def _steps():
    """Steps of every kind the decoders send: decode, a chain, a tree (parents and a mask),
    logits rows subsets, ragged batches mixing causal and tree sequences."""
    tree = [-1, 0, 0, 1, 1, 2]
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    return [
        [StepInput(0, [3])],
        [StepInput(0, [3, 4, 5])],
        [StepInput(0, [3, 4, 5, 6, 7, 8], depths=[0, 1, 1, 2, 2, 2], parents=tree)],
        [StepInput(0, [9, 8, 7], depths=[0, 1, 1], mask=mask, logits_rows=[0, 2])],
        [StepInput(0, [3]), StepInput(1, [4, 5, 6, 7, 8], depths=[0, 1, 1, 2, 2], parents=[-1, 0, 0, 1, 2]),
         StepInput(2, [6, 1])],
        [StepInput(0, [3, 2]), StepInput(1, [1]), StepInput(2, [5, 6, 7], logits_rows=[2])],
    ]


def _runner(model, graphs):
    runner = ModelRunner(model, cache_tokens=512, block_size=4)
    if graphs:
        runner.graphs = StepGraphs(model, runner.cache, capture=False)
    prompts = {0: [1, 2, 3, 4, 5, 6, 7], 1: list(range(10, 31)), 2: [40, 41]}
    for s, p in prompts.items():
        runner.add_sequence(s)
        out = runner.step([StepInput(s, p)])  # prefill, eager or padded alike
        assert out[0].shape == (len(p), model.cfg.vocab_size)
        runner.commit({s: list(range(len(p)))})
    return runner


def test_a_padded_step_gives_the_unpadded_logits(tiny_triton):
    eager, padded = _runner(tiny_triton, False), _runner(tiny_triton, True)
    for step in _steps():
        want = eager.step(step)
        got = padded.step(step)
        for w, g, inp in zip(want, got, step):
            assert g.shape == w.shape == (len(inp.logits_rows or inp.tokens), tiny_triton.cfg.vocab_size)
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        eager.commit({inp.seq_id: [0] for inp in step})
        padded.commit({inp.seq_id: [0] for inp in step})
    # the same K/V went into both caches (padded rows wrote nothing)
    for s in (0, 1, 2):
        n = eager.context_len(s)
        assert padded.context_len(s) == n
        slots = torch.tensor(eager.cache.slots(s, 0, n))
        pslots = torch.tensor(padded.cache.slots(s, 0, n))
        ek = eager.cache.k.flatten(1, 2)[:, slots]
        pk = padded.cache.k.flatten(1, 2)[:, pslots]
        torch.testing.assert_close(pk, ek, rtol=1e-5, atol=1e-5)
    assert padded.graphs.stats["eager"] == 0


@torch.inference_mode()
@pytest.mark.parametrize("glue", ["extension", "python"])
def test_a_staged_step_fills_the_graph_inputs_as_the_copies_do(tiny_triton, glue, monkeypatch):
    """``StepGraphs.stage`` (the step packed on the host in the graph's own layout, padded, one
    copy; glued in the extension, models/cpu/packext.c, or in Python) against its reference,
    ``prepare`` then ``_fill`` (a copy per piece), byte for byte: every kind of step, in turn,
    so each shape's buffers hold an earlier step's values."""
    if not packing.enabled():
        pytest.skip(f"the compiled packing did not build: {packing.LIBRARY.reason}")
    if glue == "extension" and packing.EXT.get() is None:
        pytest.skip(f"the packing's extension did not build: {packing.EXT.reason}")
    monkeypatch.setattr(packing.cbuild, "_glue", {"on": glue == "extension"})
    calls = {"ext": 0}
    if glue == "extension":
        real = packing.EXT.module.pack_padded

        def counted(*a):
            out = real(*a)
            calls["ext"] += out is not None
            return out

        monkeypatch.setattr(packing.EXT.module, "pack_padded", counted)
    staged, filled = _runner(tiny_triton, True), _runner(tiny_triton, True)
    for r in (staged, filled):
        r.add_sequence(3)
        r.step([StepInput(3, [50, 51, 52])])
        r.commit({3: [0, 1, 2]})
    V, ctx = tiny_triton.cfg.vocab_size, staged.max_context
    tree4 = dict(depths=[0, 1, 1, 2], parents=[-1, 0, 0, 1])
    steps = _steps() + [  # pairs of one shape, the second with fewer rows, logits rows or sequences
        [StepInput(0, [3, 4, 5, 6, 7, 8, 9])], [StepInput(0, [3, 4, 5, 6, 7])],
        [StepInput(0, [3, 4, 5], logits_rows=[2]), StepInput(1, [6]), StepInput(2, [7]), StepInput(3, [1, 2])],
        [StepInput(0, [3, 4, 5]), StepInput(1, [6]), StepInput(2, [7])],
        [StepInput(0, [3]), StepInput(1, [4]), StepInput(2, [6]), StepInput(3, [1, 2, 3, 4], **tree4)],
        [StepInput(0, [3]), StepInput(1, [1, 2, 3, 4], **tree4), StepInput(2, [6])],
    ]
    calls["ext"] = 0  # the prefills above went through it too
    for step in steps + steps[::-1] + steps:
        got = staged.graphs.stage(step, V, ctx)
        if any(inp.mask is not None for inp in step):  # an explicit mask: the reference path takes it
            assert got is None
            continue
        g, R = got
        tokens, meta, idx = filled.prepare(step)
        assert filled.graphs.shape_of(tokens, meta, idx) == g.shape
        want = filled.graphs._graph(g.shape)
        filled.graphs._fill(want, tokens, meta, idx)
        assert R == (tokens.numel() if idx is None else idx.numel())
        assert torch.equal(g.dev, want.dev)
        staged.graphs.graphs[g.shape], filled.graphs.graphs[g.shape] = g, want  # kept, as a replay keeps them
        for r in (staged, filled):
            r.commit({inp.seq_id: [0] for inp in step})
    assert [staged.context_len(s) for s in range(4)] == [filled.context_len(s) for s in range(4)]
    assert staged.cache.blocks == filled.cache.blocks and staged.cache.free_blocks == filled.cache.free_blocks
    assert calls["ext"] == (3 * 11 if glue == "extension" else 0)  # every step without an explicit mask
    # refused: nothing reserved, the reference then names what is wrong; too large: run() takes it
    free = len(staged.cache.free_blocks)
    assert staged.graphs.stage([StepInput(0, [3, V])], V, ctx) is None
    assert staged.graphs.stage([StepInput(0, list(range(1, 300)))], V, ctx) is None
    monkeypatch.setattr(staged.graphs, "width", 2)  # graphs whose block tables are narrower than sequence 1's
    assert staged.graphs.stage([StepInput(1, [3])], V, ctx) is None
    assert len(staged.cache.free_blocks) == free
    with pytest.raises(ValueError, match="token ids"):
        staged.step([StepInput(0, [3, V])])


def test_step_shapes_are_padded_to_powers_of_two(tiny_triton):
    runner = _runner(tiny_triton, True)
    g = runner.graphs
    tokens, meta, idx = runner.prepare(_steps()[4])  # 8 rows, 3 sequences, a tree, all rows
    # the block table as wide as one sequence can grow (the model's 256 positions in blocks of 4; the
    # cache holds 128), whatever its context now
    assert tiny_triton.cfg.max_position_embeddings == 256 and runner.cache.num_blocks == 128 and g.width == 64
    assert g.shape_of(tokens, meta, idx) == StepShape(rows=8, batch=4, width=64, max_q=8, words=1, causal=True,
                                                      logits=8)
    tokens, meta, idx = runner.prepare(_steps()[5])  # 6 rows, logits of 4: padded to the rows
    assert g.shape_of(tokens, meta, idx) == StepShape(rows=8, batch=4, width=64, max_q=4, words=0, causal=False,
                                                      logits=8)
    tokens, meta, idx = runner.prepare([StepInput(0, list(range(33)), parents=[-1] + list(range(32)))])
    assert g.shape_of(tokens, meta, idx).words == 2  # the mask words of the padded 64 rows
    # a step of as many rows as the limit is padded; one past it runs eagerly
    small = StepGraphs(tiny_triton, runner.cache, max_tokens=4, max_batch=2, capture=False)
    tokens, meta, idx = runner.prepare([StepInput(0, [1, 2, 3, 4])])
    assert small.shape_of(tokens, meta, idx).rows == 4
    tokens, meta, idx = runner.prepare([StepInput(0, [1, 2, 3, 4, 5])])
    assert small.shape_of(tokens, meta, idx) is None and small.run(tokens, meta, idx) is None
    tokens, meta, idx = runner.prepare([StepInput(0, [1]), StepInput(1, [1]), StepInput(2, [1])])
    assert small.shape_of(tokens, meta, idx) is None
    assert small.stats["eager"] == 1


def test_shapes_are_kept_least_recently_used_first_out(tiny_triton):
    runner = _runner(tiny_triton, False)
    g = StepGraphs(tiny_triton, runner.cache, max_graphs=2, capture=False)
    runner.prepare([StepInput(0, list(range(1, 9)))])  # room reserved once: every step below has one width
    shapes = []
    for T in (1, 2, 1, 4):
        tokens, meta, idx = runner.prepare([StepInput(0, list(range(1, T + 1)))])
        g.run(tokens, meta, idx)
        shapes.append(g.shape_of(tokens, meta, idx))
    assert shapes[0] == shapes[2] and len(set(shapes)) == 3
    assert list(g.graphs) == [shapes[0], shapes[3]]  # the 1-row shape was used again after the 2-row one


def test_a_growing_context_keeps_its_step_shape(tiny_triton):
    runner = _runner(tiny_triton, True)
    shapes = set()
    for _ in range(40):  # sequence 0 grows from 7 to 47 tokens: 2 to 12 blocks of 4
        tokens, meta, idx = runner.prepare([StepInput(0, [3])])
        shapes.add(runner.graphs.shape_of(tokens, meta, idx))
        runner.forward(tokens, meta, idx)
        runner.commit({0: [0]})
    assert len(shapes) == 1 and len(runner.graphs.graphs) <= 4  # the prefills' shapes and this one


def test_warm_up_captures_every_shape_of_batch_one_decoding(tiny_triton, monkeypatch):
    runner = _runner(tiny_triton, False)
    g = StepGraphs(tiny_triton, runner.cache, max_tokens=64, capture=False)
    assert g.warm_up() == 0  # nothing to capture without a GPU
    g.capture = True  # what a GPU would capture, recorded instead
    captured = []
    monkeypatch.setattr(g, "_capture", lambda graph: captured.append(graph.shape))
    assert g.warm_up() == 14 == len(captured)  # rows 1, 2, ..., 64, causal and with a tree mask
    assert g.warm_up() == 0  # all there already
    for bad in ((), (0,), (1.5,), ("1",)):
        with pytest.raises(ValueError, match="batches must be a non-empty tuple of ints >= 1"):
            g.warm_up(bad)
    for T in range(1, 65):
        for tree in (False, True):
            for rows in (None, [T - 1]):
                parents = [-1] + [max(0, i - 2) for i in range(T - 1)] if tree else None
                tokens, meta, idx = runner.prepare([StepInput(0, list(range(1, T + 1)), parents=parents,
                                                              logits_rows=rows)])
                assert g.shape_of(tokens, meta, idx) in g.graphs, (T, tree, rows)
    tokens, meta, idx = runner.prepare([StepInput(0, list(range(1, 66)))])
    assert g.shape_of(tokens, meta, idx) is None  # past max_tokens: eager


def test_warm_up_of_a_batch_covers_every_step_its_shrinking_batch_takes(tiny_triton, monkeypatch):
    """A benchmark decoding batches of 4 warms up (1, 2, 4): every split of up to max_tokens rows
    over 1-4 sequences, chains and trees, must find its graph (none captured while timing)."""
    import random

    runner = _runner(tiny_triton, False)
    runner.add_sequence(3)
    g = StepGraphs(tiny_triton, runner.cache, max_tokens=16, capture=False)
    g.capture = True  # what a GPU would capture, recorded instead
    monkeypatch.setattr(g, "_capture", lambda graph: None)
    n = g.warm_up((1, 2, 4))
    assert n == len(g.graphs) and n < 60
    rng = random.Random(0)
    for _ in range(300):
        B = rng.randint(1, 4)
        T = rng.randint(B, 16)
        cuts = sorted(rng.sample(range(1, T), B - 1))
        sizes = [b - a for a, b in zip([0] + cuts, cuts + [T])]
        inputs = []
        for sid, size in enumerate(sizes):
            tree = rng.random() < 0.5 and size > 2
            parents = [-1] + [rng.randrange(i + 1) for i in range(size - 1)] if tree else None
            inputs.append(StepInput(sid, list(range(1, size + 1)), parents=parents,
                                    logits_rows=None if rng.random() < 0.5 else [size - 1]))
        tokens, meta, idx = runner.prepare(inputs)
        assert g.shape_of(tokens, meta, idx) in g.graphs, sizes


def test_a_failed_warm_up_stops_and_leaves_steps_eager(tiny_triton, monkeypatch):
    runner = _runner(tiny_triton, False)
    g = StepGraphs(tiny_triton, runner.cache, max_tokens=8, capture=False)
    g.capture = True

    def fail(graph):
        raise RuntimeError("capture refused")
    monkeypatch.setattr(g, "_capture", fail)
    with pytest.warns(UserWarning, match="capture refused"):
        assert g.warm_up() == 0
    assert g.failed == "RuntimeError: capture refused" and g.max_tokens == 0 and not g.graphs
    tokens, meta, idx = runner.prepare([StepInput(0, [3])])
    assert g.run(tokens, meta, idx) is None and g.stats["eager"] == 1


def test_the_shared_runner_is_sized_and_warmed_once(tiny_triton):
    with pytest.raises(ValueError, match="needs CUDA graphs on"):
        ModelRunner.warm_up_shared(tiny_triton, 1, 4, 4)
    use_cuda_graphs(tiny_triton, capture=False)
    try:
        with pytest.raises(ValueError, match="must be >= 1"):
            ModelRunner.warm_up_shared(tiny_triton, 1, 0, 4)
        done = ModelRunner.warm_up_shared(tiny_triton, 2, 40, 8)
        runner = tiny_triton.shared_runner
        assert done["captured"] == 0 and done["failed"] is None  # nothing is captured without a GPU
        assert done["cache_tokens"] == runner.cache.num_blocks * 16 >= 2 * (40 + 8 + 256)
        assert ModelRunner.for_batch(tiny_triton, [[1] * 30, [2] * 40], 8) is runner  # the timed runs reuse it
    finally:
        use_cuda_graphs(tiny_triton, False)


@pytest.mark.parametrize("name", ["ar", "lookahead+pld", "hybrid"])
def test_greedy_output_is_unchanged_through_padded_steps(tiny_triton, name):
    prompts = [[5, 6, 7, 8, 5, 6, 7, 9], [1, 2, 3, 1, 2, 3, 1, 2, 3, 4, 5, 6, 1, 2, 3, 11, 12], [40]]
    configs = {"ar": None, "lookahead+pld": LookaheadConfig(window=3, ngram=3, guesses=3),
               "hybrid": HybridConfig()}
    def make():
        return make_proposer(name, config=configs[name])
    want = [r.output_ids for r in generate(tiny_triton, prompts, make(), max_new_tokens=10, eos_token_ids=())]
    use_cuda_graphs(tiny_triton, capture=False)
    try:
        got = [r.output_ids for r in generate(tiny_triton, prompts, make(), max_new_tokens=10, eos_token_ids=())]
        shared = tiny_triton.shared_runner
        assert shared is not None and len(shared.graphs.graphs) > 1  # prompts of <= 256 tokens too
        again = [r.output_ids for r in generate(tiny_triton, prompts[:1], make(), max_new_tokens=4, eos_token_ids=())]
        assert tiny_triton.shared_runner is shared  # free and large enough: reused, graphs and all
    finally:
        use_cuda_graphs(tiny_triton, False)
    assert got == want and again[0] == want[0][:4]


def test_shared_runner_grows_and_is_not_handed_out_while_in_use(tiny_triton):
    use_cuda_graphs(tiny_triton, capture=False)
    try:
        a = ModelRunner.for_batch(tiny_triton, [[1] * 10], 10)
        assert ModelRunner.for_batch(tiny_triton, [[1] * 10], 10) is a
        a.add_sequence(0)
        b = ModelRunner.for_batch(tiny_triton, [[1] * 10], 10)  # a holds a sequence
        assert b is not a and tiny_triton.shared_runner is a and b.graphs is not None
        a.free(0)
        big = ModelRunner.for_batch(tiny_triton, [[1] * 10] * 40, 10)
        assert big is tiny_triton.shared_runner and big is not a
        assert big.cache.num_blocks >= 2 * a.cache.num_blocks
    finally:
        use_cuda_graphs(tiny_triton, False)
    assert tiny_triton.shared_runner is None
    plain = ModelRunner.for_batch(tiny_triton, [[1] * 10], 10)
    assert plain.graphs is None


def test_a_failed_capture_falls_back_to_eager_steps(tiny_triton, monkeypatch):
    runner = _runner(tiny_triton, True)
    g = runner.graphs
    g.capture = True  # as on a GPU, with a capture that fails

    def broken(graph):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(g, "_capture", broken)
    eager = _runner(tiny_triton, False)
    step = [StepInput(0, [3])]
    with pytest.warns(UserWarning, match="capture failed"):
        got = runner.step(step)[0]
    torch.testing.assert_close(got, eager.step(step)[0], rtol=1e-5, atol=1e-5)
    assert g.failed.startswith("RuntimeError") and g.run(*runner.prepare(step)) is None  # eager from now on


def test_bad_graph_setups_are_refused_clearly():
    torch_model = ours_from_hf(tiny_hf_model("llama", seed=3), kernel="torch").model
    with pytest.raises(ValueError, match="triton kernel backend"):
        use_cuda_graphs(torch_model)
    with pytest.raises(ValueError, match="triton kernel backend"):
        StepGraphs(torch_model, ModelRunner(torch_model, cache_tokens=64).cache, capture=False)
    triton_model = tiny_triton_model()
    if not GPU:
        with pytest.raises(ValueError, match="CUDA device"):
            use_cuda_graphs(triton_model)
        with pytest.raises(ValueError, match="CUDA device"):
            StepGraphs(triton_model, ModelRunner(triton_model, cache_tokens=64).cache, capture=True)
    for kw, name in ((dict(max_tokens=0), "max_tokens"), (dict(max_batch=0), "max_batch"),
                     (dict(max_graphs=0), "max_graphs")):
        with pytest.raises(ValueError, match=name):
            StepGraphs(triton_model, ModelRunner(triton_model, cache_tokens=64).cache, capture=False, **kw)


def test_cli_flag_needs_a_gpu_and_triton(capsys):
    from decoding.cli import parse_args
    with pytest.raises(SystemExit):
        parse_args(["hello", "--cuda-graphs", "--device", "cpu"])
    assert "--cuda-graphs needs --device cuda and --kernel triton" in capsys.readouterr().err


# ---- the capture itself: only where CUDA is present -------------------------------------------
@pytest.mark.skipif(not GPU, reason="needs CUDA (and Triton not interpreted)")
def test_replayed_steps_give_the_eager_logits_on_a_gpu(tiny_triton):
    eager = ModelRunner(tiny_triton, cache_tokens=512, block_size=4)
    graphed = ModelRunner(tiny_triton, cache_tokens=512, block_size=4, graphs=True)
    for r in (eager, graphed):
        r.add_sequence(0)
        r.step([StepInput(0, list(range(1, 12)))])
        r.commit({0: list(range(11))})
    for step in ([StepInput(0, [3])], [StepInput(0, [3, 4, 5], depths=[0, 1, 1], parents=[-1, 0, 0])]) * 3:
        torch.testing.assert_close(graphed.step(step)[0], eager.step(step)[0], rtol=1e-4, atol=1e-4)
        for r in (eager, graphed):
            r.commit({0: [0]})
    # the prefill (11 rows) and the two step shapes: each captured once, replayed afterwards
    assert graphed.graphs.stats["captures"] == 3 and graphed.graphs.stats["replays"] == 4


@pytest.mark.skipif(not GPU, reason="needs CUDA (and Triton not interpreted)")
@pytest.mark.parametrize("name", ["ar", "lookahead+pld", "hybrid"])
def test_greedy_output_is_unchanged_with_cuda_graphs(tiny_triton, name):
    prompts = [[5, 6, 7, 8, 5, 6, 7, 9], [1, 2, 3, 1, 2, 3, 1, 2, 3, 4, 5, 6, 1, 2, 3, 11, 12], [40]]
    want = [r.output_ids for r in generate(tiny_triton, prompts, make_proposer(name), max_new_tokens=24,
                                           eos_token_ids=())]
    use_cuda_graphs(tiny_triton)
    try:
        got = [r.output_ids for r in generate(tiny_triton, prompts, make_proposer(name), max_new_tokens=24,
                                              eos_token_ids=())]
        stats = tiny_triton.shared_runner.graphs.stats
    finally:
        use_cuda_graphs(tiny_triton, False)
    assert got == want
    assert stats["captures"] > 0 and stats["replays"] > 0
