"""The model with block-quantized products (models/loader.py ``weights``, kernels/quant.py):
against a torch reference forward, greedy speculation token-identical to plain greedy (on these
models and prompts; a tree's accepted branch leaves the cache a chain would: the test at the end), the default
model's own Q4_1 / Q8_0 blocks, and the option's errors.

Tolerance of the reference forward, stated once: the reference multiplies the same quantized
activations by the same dequantized weights exactly, so each product differs by fp32 rounding
only; through two layers a rounding can move an activation across a quantization step, so the
logits are compared at 1e-3 of their largest magnitude."""

import numpy as np
import pytest
import torch

from decoding import generate
from helpers import tiny_hf_model
from kernels import quant, skinny
from models import linear as linear_mod, llama as llama_mod
from models.loader import check_weights, from_hf, load_model, resolve_weights
from models.runner import ModelRunner, StepInput
from models.tune import tune_model
from test_decoding import TINY_PROMPTS, outputs, proposer

pytestmark = pytest.mark.skipif(not skinny.available(), reason=f"skinny kernels: {skinny.unavailable_reason()}")
METHODS = ("pld", "lookahead+pld", "hybrid", "suffix", "jacobi")


def tiny(arch="llama", weights="q8_0"):
    # K of every product a multiple of 32; 3 blocks in the MLP's down product (an odd count)
    return from_hf(tiny_hf_model(arch, seed=3, intermediate_size=96), weights=weights).model


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_quantized_forward_matches_the_reference(arch, monkeypatch):
    """A tree step through the one-call stack against the per-op forward whose products are
    ``quant_linear_ref`` (dequantized weights, the same quantized activations, float64)."""
    model = tiny(arch)
    assert model.weights == "q8_0" and model.head_quant is not None and model.head_screen() is None
    assert all(lin.weight.device.type == "meta" for lin in model.modules() if isinstance(lin, linear_mod.Linear))
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, model.cfg.vocab_size, (7,), generator=gen).tolist()
    parents = [-1, 0, 0, 1, 1, 2, 5]

    def logits(whole_stack: bool):
        runner = ModelRunner(model, cache_tokens=256, block_size=4)
        runner.add_sequence(0)
        runner.step([StepInput(0, list(range(3, 12)))])  # a prompt (causal: the per-op path), committed
        runner.commit({0: list(range(9))})
        calls = []
        original = llama_mod.Transformer._whole_stack

        def spy(self, *a):
            done = original(self, *a) if whole_stack else None
            calls.append(done is not None)
            return done
        with monkeypatch.context() as m:
            m.setattr(llama_mod.Transformer, "_whole_stack", spy)
            out = runner.step([StepInput(0, tokens, parents=parents)])[0]
        caches.append(runner.cache)
        return out, calls

    caches = []
    got, calls = logits(True)
    assert calls == [True]  # the tree step ran as one C call
    per_op, _ = logits(False)
    assert torch.equal(got, per_op)  # the stack is the per-op path, bit for bit
    # and so are the K/V it stored: fp16 here (kv_cache_dtype), rounded in C as torch rounds them
    assert caches[0].k.dtype == (torch.float16 if skinny.kv16_available() else torch.float32)
    assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)

    def ref_linear(x, w, bias=None):
        return quant.quant_linear_ref(x, w, bias)
    monkeypatch.setattr(linear_mod, "quant_linear", ref_linear)
    monkeypatch.setattr(quant, "quant_linear", ref_linear)
    ref, _ = logits(False)
    torch.testing.assert_close(got, ref, atol=1e-3 * ref.abs().max().item(), rtol=0)


def test_the_kv_cache_dtype_follows_the_products():
    """fp16 K/V where the products are quantized on a CPU (half the bytes a step's attention
    reads), fp32 with fp32 weights (the path compared with transformers), and what
    ``kv_dtype`` says where it is set."""
    q8, fp32 = tiny(), tiny(weights="fp32")
    want = torch.float16 if skinny.kv16_available() else torch.float32
    assert q8.kv_cache_dtype() == want and ModelRunner(q8, cache_tokens=64, block_size=4).cache.k.dtype == want
    assert fp32.kv_cache_dtype() == torch.float32
    q8.kv_dtype = torch.float32
    try:
        assert ModelRunner(q8, cache_tokens=64, block_size=4).cache.v.dtype == torch.float32
        q8.kv_dtype = torch.bfloat16  # no kernel of this path reads it: named before any cache is made
        with pytest.raises(ValueError, match=r"kv_dtype must be the model's dtype \(torch.float32\)"):
            ModelRunner(q8, cache_tokens=64, block_size=4)
    finally:
        q8.kv_dtype = None


@pytest.fixture(scope="module")
def tiny_q8():
    return tiny()


@pytest.mark.parametrize("name", METHODS)
def test_tiny_greedy_lossless_on_the_quantized_path(tiny_q8, name):
    """Every method's greedy output is plain greedy's, token for token, with quantized products
    (the rows of a product do not depend on the step; for trees see the last test below)."""
    ref = [generate(tiny_q8, [p], max_new_tokens=14, eos_token_ids=())[0].output_ids for p in TINY_PROMPTS]
    res = generate(tiny_q8, TINY_PROMPTS, proposer(name, tiny_q8, small=True), max_new_tokens=14, eos_token_ids=())
    assert outputs(res) == ref


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_steps_take_their_answers_from_the_quantized_heads_call(tiny_q8, monkeypatch, k):
    """A greedy step of a model with a quantized head ranks the logits inside the head's own call
    (``quant_linear_topk``'s kernel, no pass over them after): every input's argmax and top-k as its
    logits give them, empty inputs included, and the logits themselves; a step whose cost is
    emulated reduces them after the forward as before."""
    from models import runner as runner_mod
    calls = []
    for mod, key in ((quant, "topk_unchecked"), (runner_mod, "argmax_rows"), (runner_mod, "argmax_topk_rows")):
        real = getattr(mod, key)
        monkeypatch.setattr(mod, key, lambda *a, _f=real, _k=key, **kw: (calls.append(_k), _f(*a, **kw))[1])
    runner = ModelRunner(tiny_q8, cache_tokens=256)
    for s in range(4):
        runner.add_sequence(s)
    step = [StepInput(0, [3, 4, 5, 6], parents=[-1, 0, 0, 1]), StepInput(1, [7], logits_rows=[]),
            StepInput(2, [8, 9]), StepInput(3, [1, 2, 3], logits_rows=[2, 0])]
    full = runner.step(step)
    calls.clear()
    got = runner.step_greedy(step, k=k)
    assert calls == ["topk_unchecked"]
    for (lg, top1, topk), ref in zip(got, full):
        assert lg.shape == ref.shape and torch.equal(lg.tensor(), ref)
        assert top1 == ref.argmax(-1).tolist()
        assert topk == (None if k == 1 else ref.topk(k, -1).indices.tolist())
    monkeypatch.setattr(tiny_q8, "emulated_cost", object())
    assert not runner._ranked_head(k)


def test_nothing_tunes_or_packs_the_dropped_fp32_weights(tiny_q8, tmp_path):
    assert tune_model(tiny_q8, tmp_path) == {}
    assert all(getattr(m, "plan", None) is None for m in tiny_q8.modules()) and tiny_q8.head_plan is None
    assert not (tmp_path / "tune").exists()


@pytest.fixture(scope="module")
def smol_native():
    return load_model(weights="native")


def test_the_default_model_keeps_its_files_blocks(smol_native, smol):
    """native: the layers' Q4_1 and the head's Q8_0 are the file's, so dequantized they are the
    fp32 path's weights bit for bit (q / k rows unpermuted, q k v and gate up fused by rows)."""
    model, fp32 = smol_native.model, smol.model
    assert model.weights == "native" and fp32.weights == "fp32"
    for i in (0, 29):
        a, b = model.layers[i], fp32.layers[i]
        for name in ("wqkv", "wo", "w_gate_up", "w_down"):
            qw = getattr(a, name).quant
            assert qw.format == "q4_1"
            assert torch.equal(qw.dequantize(), getattr(b, name).weight)
    assert model.head_quant.format == "q8_0" and torch.equal(model.head_quant.dequantize(), fp32.head_weight)


def test_the_default_model_greedy_lossless_on_the_native_path(smol_native):
    """The real model on its native weights: a few methods token-identical to plain greedy."""
    model, tok = smol_native
    prompt = tok.apply_chat_template([{"role": "user", "content": "Write a Python function that adds two numbers."}],
                                     add_generation_prompt=True, tokenize=True, return_dict=False)
    ref = generate(model, [prompt], max_new_tokens=24)[0].output_ids
    for name in ("pld", "lookahead+pld", "hybrid"):
        assert generate(model, [prompt], proposer(name, model), max_new_tokens=24)[0].output_ids == ref, name


def test_the_weights_option():
    """The default and the errors: a bad value is named before any model loads; a quantized
    form where the kernels cannot run is refused with the reason."""
    for bad in ("q4", "FP32", 8):
        with pytest.raises(ValueError, match="weights must be one of fp32, q8_0, native"):
            check_weights(bad)
        with pytest.raises(ValueError, match="weights must be one of"):
            load_model("no/such/model", weights=bad)  # the option first, not the missing model
    with pytest.raises(ValueError, match="weights='q8_0' needs fp32 on the CPU"):
        resolve_weights("q8_0", torch.bfloat16, torch.device("cpu"))
    with pytest.raises(ValueError, match="weights='native' needs fp32 on the CPU"):
        resolve_weights("native", torch.float32, torch.device("cuda"))
    # the default: native for a GGUF file on the CPU with the kernels (the fastest form, lossless
    # for every method), fp32 for an HF folder, a GPU or another dtype
    assert resolve_weights(None, torch.float32, torch.device("cpu"), gguf=True) == "native"
    assert resolve_weights(None, torch.float32, torch.device("cpu")) == "fp32"
    assert resolve_weights(None, torch.bfloat16, torch.device("cpu"), gguf=True) == "fp32"
    assert resolve_weights(None, torch.float32, torch.device("cuda"), gguf=True) == "fp32"
    assert load_model().model.weights == "native"


@pytest.mark.parametrize("entry", ["cli", "bench"])
def test_the_weights_flag(entry, capsys):
    """--weights parses on both entry points; a bad value, or a quantized form in bfloat16, is
    refused naming the flag before any model loads."""
    import bench.run as bench_run
    from decoding import cli

    parse = (lambda extra: cli.parse_args(["a prompt"] + extra)) if entry == "cli" else bench_run.parse_args
    assert parse([]).weights is None and parse(["--weights", "q8_0"]).weights == "q8_0"
    for bad in (["--weights", "q4_0"], ["--weights", "native", "--dtype", "bfloat16"]):
        with pytest.raises(SystemExit):
            parse(bad)
        assert "--weights" in capsys.readouterr().err


@pytest.mark.parametrize("flag, form", [([], "native"), (["--weights", "fp32"], "fp32")])
def test_the_bench_loads_the_draft_model_on_the_targets_weights(flag, form, tmp_path):
    """bench/run.py's --draft-model loads on the target's weights form (the default: native for
    a GGUF file), and the header's draft line names that form."""
    import bench.run as bench_run
    from bench.loop import Bench
    from bench.measure import PeakMemory

    args = bench_run.parse_args(["--methods", "draft", "--draft-model", "smollm2", "--no-plan",
                                 "--out", str(tmp_path)] + flag)
    bench = Bench(args, PeakMemory("cpu"))
    assert bench.model.weights == bench.draft.weights == form
    assert bench.draft_line.endswith(f"; weights {form}") and bench.draft_line.startswith("smollm2 (llama, ")


def test_the_cli_passes_weights_to_the_load(monkeypatch):
    """python -m decoding --weights q8_0 loads with weights='q8_0' (the model stubbed)."""
    import io
    from types import SimpleNamespace

    from decoding import cli
    from decoding.text import TextGenerator

    seen = {}

    class Gen:
        chat_template, cache_dir, tokenizer = True, None, None
        model = SimpleNamespace(cfg=SimpleNamespace(max_position_embeddings=1000))

        def encode(self, prompt):
            return [1]

        def generate(self, prompt, proposer, **kw):
            return [SimpleNamespace(token_ids=[5], stats=SimpleNamespace(forwards=1, accepted_hist={}),
                                    finish_reason="stop")]

    def load(cls, *a, **kw):
        seen.update(kw)
        return Gen()
    monkeypatch.setattr(TextGenerator, "load", classmethod(load))
    monkeypatch.setattr(cli, "planner_for", lambda *a, **k: None)
    assert cli.main(["hi", "--weights", "q8_0", "--max-new-tokens", "2"], out=io.StringIO(), err=io.StringIO()) == 0
    assert seen["weights"] == "q8_0"


def test_packed_weights_cache_round_trip_and_a_broken_one_is_packed_again(tmp_path):
    """The packed weights a GGUF load keeps in its cache entry read back as they were; an
    unreadable file is reported and ignored (packed again), not an error."""
    from models import loader

    w = quant.quantize_q8_0(torch.randn(20, 64))
    q4 = quant.quantize_q4_1(torch.randn(7, 96))
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, size=(5, 144), dtype=np.uint8)
    raw[:, 0:4] = np.array([0.01, 0.02], np.float16).view(np.uint8)  # finite D, Dmin
    qk = quant.pack_q4_k(raw.reshape(-1), (5, 256))
    path = tmp_path / "native-v2.safetensors"
    loader._write_packed(path, {"a": w, "b": q4, "c": qk})
    shapes = {"a": (20, 64), "b": (7, 96), "c": (5, 256)}
    back = loader._read_packed(path, shapes)
    assert back.keys() == {"a", "b", "c"} and back["b"].format == "q4_1" and back["b"].n == 7
    assert back["c"].format == "q4_1f" and torch.equal(back["c"].data, qk.data)
    assert torch.equal(back["a"].data, w.data) and torch.equal(back["b"].data, q4.data)
    with pytest.warns(UserWarning, match=r"b is \(7, 96\) but the model's is \(8, 96\)"):  # another model's
        assert loader._read_packed(path, {**shapes, "b": (8, 96)}) is None
    path.write_bytes(b"not safetensors")
    with pytest.warns(UserWarning, match="unreadable"):
        assert loader._read_packed(path, shapes) is None
    assert loader._read_packed(tmp_path / "missing.safetensors", shapes) is None
    loader._write_packed(tmp_path / "no" / "entry.safetensors", {"a": w})  # no entry folder: skipped
    assert not (tmp_path / "no").exists()


def test_a_committed_tree_branch_leaves_the_cache_as_a_chain_does(smol_native):
    """After a long prompt, a tree step whose accepted branch skips a row ([a, x, b], b a child of
    a) and then a one-token step gives the logits a chain [a, b] gives, bit for bit: the skinny
    attention sums a tree row's visible keys by rank, as a chain holds them (kernels/cpu/
    skinny_attention.c). When it followed the keys' places, the two differed by rounding, which
    fp32 absorbed and quantized activations turned into other int8 values, so a greedy token could
    change (bench run-native: suffix and hybrid)."""
    from bench.data.suite import load_suite

    model, tok = smol_native
    text = load_suite(tasks="summarization", limit=1)[0]["prompt"]
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
                                     return_dict=False)

    def next_logits(step: StepInput, accepted: list[int]) -> torch.Tensor:
        runner = ModelRunner(model, cache_tokens=2048, block_size=16)
        runner.add_sequence(0)
        runner.step([StepInput(0, prompt)])
        runner.commit({0: list(range(len(prompt)))})
        runner.step([step])
        runner.commit({0: accepted})
        return runner.step([StepInput(0, [657])])[0][-1]

    chain = next_logits(StepInput(0, [1348, 1941]), [0, 1])
    tree = next_logits(StepInput(0, [1348, 999, 1941], parents=[-1, 0, 0], depths=[0, 1, 1]), [0, 2])
    assert torch.equal(chain, tree)


def test_native_takes_a_files_q4_k_products_where_every_fused_part_is_q4_k(tmp_path):
    """A GGUF file's Q4_K tensors (the loader's _gguf_blocks, a file written here) become q4_1f
    products equal to gguf's dequantization of their rows, bit for bit, where every part of a
    fused product is Q4_K (q / k / v, down); a fused product with a part of another type (gate
    Q4_K beside up Q8_0), and the products the file does not hold, are Q8_0 from fp32."""
    import gguf
    import gguf.quants as gq

    from helpers import ours_from_hf, tiny_hf_model
    from models import loader

    if not skinny.available():
        pytest.skip(f"the quantized path needs the CPU kernels: {skinny.unavailable_reason()}")
    # hidden and intermediate sizes a multiple of Q4_K's 256-weight super-block
    model = ours_from_hf(tiny_hf_model("qwen2", hidden_size=256, intermediate_size=256), shuffle_seed=None).model
    cfg, rng = model.cfg, np.random.default_rng(1)

    def q4_k(rows: int, k: int) -> np.ndarray:
        raw = rng.integers(0, 256, size=(rows, k // 256, 144), dtype=np.uint8)
        raw[:, :, 0:4] = np.abs(rng.standard_normal((rows, k // 256, 2)) * 0.02).astype(np.float16).view(np.uint8)
        return raw.reshape(rows, -1)

    d, kv = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim
    tensors = {"blk.0.attn_q.weight": q4_k(d, d), "blk.0.attn_k.weight": q4_k(kv, d),
               "blk.0.attn_v.weight": q4_k(kv, d), "blk.0.ffn_gate.weight": q4_k(cfg.intermediate_size, d),
               "blk.0.ffn_down.weight": q4_k(d, cfg.intermediate_size)}
    up = gq.quantize(rng.standard_normal((cfg.intermediate_size, d)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    for name, raw in tensors.items():
        w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.add_tensor("blk.0.ffn_up.weight", up, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    blocks = loader._gguf_blocks(path, cfg)
    assert {n: f for n, (f, _) in blocks.items()} == {
        "model.layers.0.self_attn.q_proj.weight": "q4_k", "model.layers.0.self_attn.k_proj.weight": "q4_k",
        "model.layers.0.self_attn.v_proj.weight": "q4_k", "model.layers.0.mlp.gate_proj.weight": "q4_k",
        "model.layers.0.mlp.down_proj.weight": "q4_k", "model.layers.0.mlp.up_proj.weight": "q8_0"}
    loader.quantize_model(model, "native", path)
    layer0, layer1 = model.layers[0], model.layers[1]
    assert layer0.wqkv.quant.format == "q4_1f" and layer0.w_down.quant.format == "q4_1f"
    assert layer0.w_gate_up.quant.format == "q8_0" and layer0.wo.quant.format == "q8_0"
    assert {lin.quant.format for lin in (layer1.wqkv, layer1.wo, layer1.w_gate_up, layer1.w_down)} == {"q8_0"}
    want = np.concatenate([gq.dequantize(tensors[f"blk.0.attn_{x}.weight"], gguf.GGMLQuantizationType.Q4_K)
                           for x in "qkv"])
    got = layer0.wqkv.quant.dequantize().numpy()
    assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))


def test_the_one_call_stack_sees_a_product_quantized_again_after_a_step():
    """The one-call layer stack keeps its pointer table between steps and does not ask a
    quantized product's packed bytes for their pointer each step: ``Linear.quantize`` with new
    weights between two steps of one runner must be what the second uses, as in a model built
    with them; a norm replaced through ``.data`` too."""
    def runner_of(model):
        runner = ModelRunner(model, cache_tokens=128)
        runner.add_sequence(0)
        runner.step([StepInput(0, list(range(3, 20)))])
        runner.commit({0: list(range(17))})
        return runner

    def step(runner):  # not committed: the same step again rewrites the same slots
        return runner.step([StepInput(0, [21, 22])])[0]

    model = tiny()
    runner = runner_of(model)
    new_w = quant.quantize_q8_0(torch.randn(model.layers[1].w_down.weight.shape) * 0.05)
    new_norm = torch.rand_like(model.layers[-1].mlp_norm) + 0.5  # after the last K/V: the prefix holds
    before = step(runner)
    model.layers[1].w_down.quantize(new_w)
    expected = tiny()
    expected.layers[1].w_down.quantize(new_w)
    after = step(runner)
    assert not torch.equal(after, before) and torch.equal(after, step(runner_of(expected)))
    model.layers[-1].mlp_norm.data = new_norm.clone()
    expected.layers[-1].mlp_norm.data = new_norm.clone()
    again = step(runner)
    assert not torch.equal(again, after) and torch.equal(again, step(runner_of(expected)))


def test_the_side_stream_changes_no_number_and_follows_the_cache(monkeypatch):
    """The one-call stack's side stream (cpu/side_prefetch.h: the next layer's keys and values
    requested while the products stream) on and off: the same logits and caches bit for bit; on
    where the step's weights and keys and values exceed the last-level cache, off where they fit,
    forced by SPECDEC_SIDE_PREFETCH."""
    model = tiny()
    sides = []
    original = skinny.layers_unchecked

    def spy(h, layers, n, step):
        sides.append(step.side)
        return original(h, layers, n, step)
    monkeypatch.setattr(skinny, "layers_unchecked", spy)

    def run():
        runner = ModelRunner(model, cache_tokens=256, block_size=4)
        runner.add_sequence(0)
        runner.step([StepInput(0, list(range(3, 40)))])
        runner.commit({0: list(range(37))})
        out = runner.step([StepInput(0, [5, 6, 7, 8, 9], parents=[-1, 0, 0, 1, 3])])[0]
        return out, runner.cache.k.clone(), runner.cache.v.clone()

    weights = model._step_weight_bytes(model._stack_parts()[1])
    half = skinny.kv16_available()  # fp16 K/V, else fp32; 37 committed keys and the step's 5
    kv = 2 * len(model.layers) * model.cfg.num_kv_heads * model.cfg.head_dim * (2 if half else 4) * 42
    got = {}
    for env, llc, side in (("1", None, 1), ("0", None, 0), ("", weights + kv, 0), ("", weights + kv - 1, 1),
                           ("", None, 1)):
        monkeypatch.setenv("SPECDEC_SIDE_PREFETCH", env)
        monkeypatch.setattr(skinny, "_llc", [llc])
        sides.clear()
        got[env, llc] = run()
        assert sides == [side], (env, llc)  # the tree step (the prompt runs per op)
    first = next(iter(got.values()))
    for out in got.values():
        assert all(torch.equal(a, b) for a, b in zip(out, first))
    monkeypatch.setenv("SPECDEC_SIDE_PREFETCH", "yes")
    with pytest.raises(ValueError, match="SPECDEC_SIDE_PREFETCH must be 0 or 1"):
        run()


def test_the_cache_size_read_from_sysfs(tmp_path):
    for i, (kind, size) in enumerate((("Data", "48K"), ("Instruction", "64M"), ("Unified", "2048K"),
                                      ("Unified", "300M"), ("Unified", "bad"))):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "type").write_text(kind + "\n")
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    assert skinny.cache_bytes(tmp_path) == 300 << 20
    (tmp_path / "index3" / "size").unlink()
    assert skinny.cache_bytes(tmp_path) == 2048 << 10
    assert skinny.cache_bytes(tmp_path / "none") is None


def test_the_side_streams_rule_in_words(monkeypatch):
    """The bench header's ``side stream`` line: forced, by the cache size, or on without one."""
    monkeypatch.setenv("SPECDEC_SIDE_PREFETCH", "0")
    assert skinny.side_stream_rule() == "off (SPECDEC_SIDE_PREFETCH=0)"
    monkeypatch.setenv("SPECDEC_SIDE_PREFETCH", "1")
    assert skinny.side_stream_rule() == "on (SPECDEC_SIDE_PREFETCH=1)"
    monkeypatch.delenv("SPECDEC_SIDE_PREFETCH")
    monkeypatch.setattr(skinny, "_llc", [300 << 20])
    assert skinny.side_stream_rule().startswith("on where a step's weights, keys and values exceed the 300 MB")
    monkeypatch.setattr(skinny, "_llc", [None])
    assert skinny.side_stream_rule() == "on: no last-level cache size known"
    monkeypatch.setenv("SPECDEC_SIDE_PREFETCH", "on")
    with pytest.raises(ValueError, match="SPECDEC_SIDE_PREFETCH must be 0 or 1"):
        skinny.side_stream_rule()
