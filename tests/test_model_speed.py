"""bench/model_speed.py (decode bandwidth, step-cost curve) runs at a tiny shape on the CPU and
measures what it says; ModelRunner.prepare + the forward is exactly ModelRunner.step."""

import json
import re

import pytest
import torch

from bench.model_speed import SHAPES, main, random_model, weight_bytes
from decoding.generate import default_prefill_chunk
from models.cost import random_tree as random_tree_mask
from kernels.backend import get_backend
from models.config import ModelConfig
from models.runner import ModelRunner, StepInput


def test_random_tree_mask_is_an_ancestor_closure():
    gen = torch.Generator().manual_seed(3)
    for T in (1, 2, 7, 40):
        depth, mask = random_tree_mask(T, gen)
        assert mask.shape == (T, T) and mask.diagonal().all()
        assert not mask.triu(1).any()  # a node sees only earlier nodes
        for i in range(T):
            assert depth[i] == int(mask[i].sum()) - 1  # ancestors = depth
            for j in range(i):  # ancestors' ancestors are visible too
                if mask[i, j]:
                    assert (mask[i] | ~mask[j]).all()


def test_random_model_shape_and_weight_bytes():
    cfg = ModelConfig(**SHAPES["tiny"])
    model = random_model(cfg, get_backend("torch"), torch.float32, torch.device("cpu"))
    n = sum(p.numel() for p in model.parameters()) - cfg.vocab_size * cfg.hidden_size  # untied: no table
    assert weight_bytes(model) == 4 * n
    assert torch.isfinite(model.inv_freq).all() and model.inv_freq.dtype == torch.float32
    runner = ModelRunner(model, cache_tokens=64)
    runner.add_sequence(0)
    (logits,) = runner.step([StepInput(0, [1, 2, 3])])
    assert logits.shape == (3, cfg.vocab_size) and torch.isfinite(logits).all()


def test_prepare_then_forward_equals_step():
    cfg = ModelConfig(**SHAPES["tiny"])
    model = random_model(cfg, get_backend("torch"), torch.float32, torch.device("cpu"), seed=1)
    runner = ModelRunner(model, cache_tokens=256)
    for s, n in ((0, 5), (1, 9)):
        runner.add_sequence(s)
        runner.step([StepInput(s, list(range(1, n + 1)))])
        runner.commit({s: list(range(n))})
    gen = torch.Generator().manual_seed(0)
    depth, mask = random_tree_mask(6, gen)
    inputs = [StepInput(0, [4, 5, 6, 7, 8, 9], depths=depth, mask=mask, logits_rows=[0, 2, 5]),
              StepInput(1, [3])]
    tokens, meta, idx = runner.prepare(inputs)
    with torch.inference_mode():
        packed = model(tokens, meta, runner.cache.k, runner.cache.v, idx)
    per_seq = runner.step(inputs)
    assert torch.equal(torch.cat(per_seq), packed)
    assert runner.context_len(0) == 5 and runner.context_len(1) == 9  # nothing committed


def test_quick_run_writes_tables_and_chart(tmp_path):
    out = tmp_path / "speed"
    res = main(["--shape", "tiny", "--quick", "--device", "cpu", "--kernel", "torch", "--out", str(out),
                "--cache-dir", str(tmp_path / "cache")])
    assert [r["batch"] for r in res["decode"]] == [1, 2]
    assert [(r["batch"], r["step_tokens"]) for r in res["step_cost"]] == [(b, t) for b in (1, 2) for t in (1, 4, 16)]
    for r in res["decode"]:
        assert r["forward_ms"] > 0 and r["tok_s"] == pytest.approx(r["batch"] / (r["forward_ms"] * 1e-3))
        assert r["weight_gbs"] == pytest.approx(res["header"]["weight_bytes"] / (r["forward_ms"] * 1e-3) / 1e9)
    assert all(r["forward_rel"] == 1.0 for r in res["step_cost"] if r["step_tokens"] == 1)
    assert all(r["baseline_ms"] > 0 for r in res["step_cost"] + res["decode"])  # beside the tuned forward
    assert set(res["header"]["product_tables"]) == {"256x128", "128x128", "512x128", "128x256"}  # head = gate_up
    assert res["header"]["copy_gbs"] > 0
    assert json.loads((out / "model_speed.json").read_text())["header"]["shape"] == "tiny"
    assert "Step cost" in (out / "model_speed.md").read_text()
    assert (out / "model_speed.md").read_text().startswith("# Model speed: tiny (random weights)\n")
    assert (out / "step_cost.png").read_bytes()[:4] == b"\x89PNG"
    from bench.model_speed import markdown
    res["header"]["model"] = "qwen2.5-coder-1.5b"  # a real model: its name, not the default shape's
    assert markdown(res).startswith("# Model speed: qwen2.5-coder-1.5b (weights fp32)\n")


def test_each_step_is_set_against_the_measured_roofline(tmp_path):
    from kernels import skinny

    if not skinny.available():
        pytest.skip(f"skinny kernel: {skinny.unavailable_reason()}")
    isas = skinny.cpu_isas()
    res = main(["--shape", "tiny", "--quick", "--device", "cpu", "--kernel", "torch", "--isa", ",".join(isas),
                "--prefill", "600", "--out", str(tmp_path / "speed"), "--cache-dir", str(tmp_path / "cache")])
    roof = res["header"]["roofline"]
    assert res["header"]["weights"] == "fp32" and res["header"]["quant_bytes"] is None  # fp32: as it was
    assert "int8_peak_gops" not in roof and "int8_peak" not in res["step_cost"][0]
    assert set(roof["peak_gflops"]) == ({"256", "512"} if "avx512f" in skinny.cpu_flags() else {"256"})
    assert all(v > 0 for v in roof["peak_gflops"].values()) and roof["bandwidth_gbs"] > 0
    layer, head = res["header"]["layer_flops_per_row"], res["header"]["head_flops_per_row"]
    assert layer == 2 * 2 * (128 * 256 + 128 * 128 + 128 * 512 + 256 * 128) and head == 2 * 512 * 128
    peak = max(roof["peak_gflops"].values())
    for r in res["step_cost"]:
        rows = r["batch"] * r["step_tokens"]
        attention = 4 * 2 * 4 * 32 * rows * (64 + r["step_tokens"])  # layers, heads, head_dim; context 64 (--quick)
        assert r["flops"] == rows * (layer + head) + attention
        assert r["bandwidth_gbs"] > 0  # measured again beside the point: its floor uses that
        floor = max(res["header"]["weight_bytes"] / (r["bandwidth_gbs"] * 1e9), r["flops"] / (peak * 1e9)) * 1e3
        assert r["roofline_ms"] == pytest.approx(floor) and r["vs_roofline"] == pytest.approx(r["forward_ms"] / floor)
    # every point timed on each build, back to back
    assert [r["isa"] for r in res["step_cost"]] == isas * 6 and skinny.isa() == isas[-1]
    assert "## Against the roofline" in (tmp_path / "speed" / "model_speed.md").read_text()
    # where the forward goes: the stack's phases and the rest add up to a forward's time
    from kernels.skinny import STACK_PHASES
    profiled = [r for r in res["step_cost"] if "stack_phases_ms" in r]  # where the tuner kept the one-call stack
    assert profiled
    for r in profiled:
        split = r["stack_phases_ms"]
        assert set(split) == set(STACK_PHASES) | {"outside"}
        assert all(v >= 0 for v in split.values()) and split["qkv"] > 0 and split["attention"] > 0
        assert sum(split.values()) < 20 * r["forward_ms"]  # one forward, not a sum over repetitions
    assert "## Where a forward's time goes" in (tmp_path / "speed" / "model_speed.md").read_text()
    # the prefill of a 600-token prompt in generate's chunks on a CPU (one), each build, against its floor
    assert [r["isa"] for r in res["prefill"]] == isas
    chunk = default_prefill_chunk("cpu")
    for r in res["prefill"]:
        assert r["tokens"] == 600 and r["chunk"] == chunk and r["ms"] > 0
        assert r["flops"] == 600 * layer + head + 4 * 2 * 4 * 32 * 600 * 601 // 2  # causal: row i sees i + 1 keys
        reads = -(-600 // chunk) * res["header"]["weight_bytes"]  # the weights once per chunk
        floor = max(reads / (r["bandwidth_gbs"] * 1e9), r["flops"] / (peak * 1e9)) * 1e3
        assert r["roofline_ms"] == pytest.approx(floor)
    assert "## Prefill" in (tmp_path / "speed" / "model_speed.md").read_text()


def test_bad_arguments_are_rejected():
    with pytest.raises(SystemExit):
        main(["--shape", "tiny", "--batch", "0"])
    with pytest.raises(SystemExit):
        main(["--shape", "tiny", "--step-tokens", "2048"])
    with pytest.raises(SystemExit):
        main(["--shape", "tiny", "--copy-mb", "0"])
    with pytest.raises(SystemExit):
        main(["--shape", "tiny", "--isa", "avx1024"])


@pytest.mark.parametrize("argv,message", [
    (["--prefill", "-1"], "--prefill must be >= 0"),
    (["--prefill", "5000"], "--prefill 5000 is longer than the tiny shape's 4096 positions"),
    (["--context", "4000", "--step-tokens", "1,128"], "--context 4000 \\+ --step-tokens 128 exceed"),
])
def test_bad_lengths_are_named_before_any_model_is_built(argv, message, capsys):
    from bench.model_speed import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--shape", "tiny", *argv])
    assert re.search(message, capsys.readouterr().err)


def test_profile_step_runs_and_counts_per_forward(tmp_path):
    """bench/profile_step.py on a tiny shape (host time only on a CPU): one row per profiled run,
    the busiest ops listed, the JSON written; bad flags are refused."""
    from bench import profile_step

    res = profile_step.main(["--shape", "tiny", "--steps", "2", "--tokens", "3", "--batch", "2", "--context", "16",
                             "--top", "4", "--out", str(tmp_path)])
    row = res["rows"]["eager forward"]
    assert list(res["rows"]) == ["eager forward"] and row["host_ms"] > 0 and len(row["top"]) == 4
    assert any(t["op"] == "aten::mm" or t["op"] == "aten::linear" for t in row["top"])
    assert (tmp_path / "profile_step.json").is_file()
    for bad in (["--tokens", "0"], ["--cuda-graphs"] if not torch.cuda.is_available() else ["--steps", "0"],
                ["--exact", "--kernel", "torch"]):
        with pytest.raises(SystemExit):
            profile_step.parse_args(bad)


def test_without_matplotlib_the_tables_are_written_and_no_chart(tmp_path, monkeypatch):
    """A GPU machine set up with --no-deps has no matplotlib: a warning, no PNG, tables intact."""
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *a, **kw):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("no matplotlib here")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    out = tmp_path / "speed"
    with pytest.warns(UserWarning, match="matplotlib is not installed"):
        main(["--shape", "tiny", "--quick", "--device", "cpu", "--kernel", "torch", "--out", str(out),
              "--cache-dir", str(tmp_path / "cache"), "--batch", "1", "--step-tokens", "1", "--step-batch", "1"])
    assert (out / "model_speed.md").is_file() and not (out / "step_cost.png").exists()
    from bench.report import chart
    with pytest.warns(UserWarning, match="matplotlib"):
        assert chart([], ["ar"], ["qa"], tmp_path / "c.png") is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="refused only without a GPU")
def test_cuda_graphs_flag_needs_a_gpu(capsys):
    with pytest.raises(SystemExit):
        main(["--shape", "tiny", "--cuda-graphs"])
    assert "--cuda-graphs needs a CUDA device" in capsys.readouterr().err


def test_exact_flag_needs_the_triton_kernels(capsys):
    with pytest.raises(SystemExit):
        main(["--shape", "tiny", "--exact", "--kernel", "torch"])
    assert "--exact runs on the triton kernels" in capsys.readouterr().err


def test_the_step_cost_cache_key_records_cuda_graphs():
    """A curve measured with graph replay is not reused for eager steps, nor the reverse."""
    from models.cost import _key

    model = random_model(ModelConfig(**SHAPES["tiny"]), get_backend("torch"), torch.float32, torch.device("cpu"))
    eager = _key(model, 256)
    model.step_graphs = {"capture": False}
    try:
        graphed = _key(model, 256)
    finally:
        model.step_graphs = None
    assert eager["cuda_graphs"] is False and graphed["cuda_graphs"] is True
    def rest(key):
        return {k: v for k, v in key.items() if k != "cuda_graphs"}
    assert rest(eager) == rest(graphed)


def test_the_step_cost_cache_key_records_a_forced_side_stream(monkeypatch):
    """A curve measured with the CPU stack's side stream forced on or off is not reused by the
    other setting, nor by the default (which follows the cache size: the key without it)."""
    from models.cost import _key

    model = random_model(ModelConfig(**SHAPES["tiny"]), get_backend("torch"), torch.float32, torch.device("cpu"))
    monkeypatch.delenv("SPECDEC_SIDE_PREFETCH", raising=False)
    default = _key(model, 256)
    keys = []
    for v in ("0", "1"):
        monkeypatch.setenv("SPECDEC_SIDE_PREFETCH", v)
        keys.append(_key(model, 256))
    assert "side" not in default and [k["side"] for k in keys] == ["0", "1"]
    assert all({k: v for k, v in key.items() if k != "side"} == default for key in keys)


def test_graph_replay_is_timed_beside_the_eager_forward(tmp_path):
    """With graphs on, every point also times the replayed forward (``ModelRunner.forward``:
    fill, replay, copy out), its ratio to eager, its bandwidth share and its own step-cost curve.
    Without a GPU the runner's graphs run the same padded steps eagerly (capture=False), which is
    what this checks the bookkeeping on; the header says what the graphs did."""
    from bench.model_speed import markdown, measure, parse_args

    args = parse_args(["--shape", "tiny", "--quick", "--device", "cpu", "--kernel", "triton", "--no-tune",
                       "--batch", "1", "--step-batch", "1", "--step-tokens", "1,2", "--out", str(tmp_path)])
    args.cuda_graphs = True  # the flag itself is refused without a GPU (tested above)
    res = measure(args)
    for r in res["decode"]:
        assert r["replay_ms"] > 0 and r["replayed"] is True
        assert r["graph_speedup"] == pytest.approx(r["forward_ms"] / r["replay_ms"])
        assert r["replay_bw_frac"] == pytest.approx(res["header"]["weight_bytes"] / (r["replay_ms"] * 1e-3) / 1e9
                                                    / res["header"]["copy_gbs"])
    first = res["step_cost"][0]
    assert [r["replay_rel"] for r in res["step_cost"]][0] == 1.0
    assert res["step_cost"][1]["replay_rel"] == pytest.approx(res["step_cost"][1]["replay_ms"] / first["replay_ms"])
    stats = res["header"]["graph_stats"]
    assert stats["eager"] == 0 and stats["failed"] is None
    assert "## Replayed from CUDA graphs" in markdown(res)


def _tiny_q4_1_model():
    """The tiny shape with Q4_1 layer products and a Q8_0 LM head, as the default model's file has."""
    from kernels.quant import quantize_q4_1, quantize_q8_0
    from models.linear import Linear

    cfg = ModelConfig(**SHAPES["tiny"])
    model = random_model(cfg, get_backend("torch"), torch.float32, torch.device("cpu"))
    for layer in model.layers:
        for m in layer.modules():
            if isinstance(m, Linear):
                m.quantize(quantize_q4_1(m.weight))
    model.head_quant = quantize_q8_0(model.head_weight)
    model.lm_head.quantize(model.head_quant)
    model.weights = "native"
    return cfg, model


def test_quantized_weight_bytes_are_the_formats_bytes_as_stored():
    """Q4_1: 20 bytes per 32 weights, Q8_0: 34; norms whole; the embedding a row at a time."""
    from bench.model_speed import quant_bytes, weight_format
    from models.loader import quantize_model

    # tiny: hidden 128, 4 heads and 2 kv heads of 32, intermediate 256, vocab 512, 2 layers (untied head)
    per_layer = (128 + 64 + 64) * 128 + 128 * 128 + 2 * 256 * 128 + 128 * 256
    layers, head = 2 * per_layer, 512 * 128
    assert layers == 294_912 and head == 65_536
    norms = (2 * 2 + 1) * 128 * 4  # two a layer and the final one, fp32
    cfg, model = _tiny_q4_1_model()
    qb = quant_bytes(model)
    assert weight_format(model) == "native"
    assert qb["formats"] == {"q4_1": (layers, layers // 32 * 20), "q8_0": (head, head // 32 * 34)}
    assert qb["products"] == 184_320 + 69_632 and qb["other"] == norms and qb["embed_row"] == 128 * 4

    model = random_model(cfg, get_backend("torch"), torch.float32, torch.device("cpu"))
    assert weight_format(model) == "fp32"
    quantize_model(model, "q8_0")
    qb = quant_bytes(model)
    assert weight_format(model) == "q8_0"
    assert qb["formats"] == {"q8_0": (layers + head, (layers + head) // 32 * 34)}
    assert qb["products"] == 382_976 and qb["other"] == norms


def test_a_quantized_floor_takes_stored_bytes_kv_and_the_int8_peak():
    """Pure numbers: 1 GB at 50 GB/s = 20 ms; 1 GOP at the int8 1,000 GOP/s = 1 ms; attention at
    the fp32 peak (the best width), not the int8 one."""
    from bench.model_speed import against_quant_roofline

    roof = dict(peak_gflops={"256": 100.0, "512": 200.0}, bandwidth_gbs=50.0,
                int8_peak_gops={"vnni512": 1000.0, "maddubs256": 250.0})
    r = against_quant_roofline(40.0, 9 * 10**8, 10**8, 10**9, 0, roof, "vnni512")
    assert r["roofline_ms"] == pytest.approx(20.0) and r["bound"] == "memory" and r["vs_roofline"] == pytest.approx(2)
    assert r["peak_frac"] == pytest.approx(1 / 40) and r["int8_peak"] == "vnni512"
    r = against_quant_roofline(100.0, 10**8, 0, 5 * 10**10, 2 * 10**9, roof, "vnni512")
    assert r["roofline_ms"] == pytest.approx(50.0 + 10.0) and r["bound"] == "compute"
    r = against_quant_roofline(100.0, 10**8, 0, 5 * 10**10, 2 * 10**9, roof, "maddubs256")  # without VNNI
    assert r["roofline_ms"] == pytest.approx(200.0 + 10.0) and r["peak_frac"] == pytest.approx(2.1)


def test_the_int8_peak_probe_measures_each_form_the_cpu_runs():
    from kernels import skinny

    if not skinny.available():
        pytest.skip(f"skinny kernel: {skinny.unavailable_reason()}")
    flags = skinny.cpu_flags()
    for kind, (_, need) in skinny.INT8_PEAKS.items():
        if all(f in flags for f in need):
            assert skinny.int8_peak_gops(kind, iters=20_000) > 0
        else:
            with pytest.raises(ValueError, match="cannot run"):
                skinny.int8_peak_gops(kind)
    assert skinny.int8_kind() == ("vnni512" if skinny._load().quant_vnni() == 1
                                  else "maddubs512" if skinny.isa() == "avx512" else "maddubs256")
    with pytest.raises(ValueError, match="kind must be one of"):
        skinny.int8_peak_gops("fp8")


def test_a_quantized_model_is_set_against_its_bytes_and_the_int8_peak(tmp_path):
    from kernels import skinny

    if not skinny.available():
        pytest.skip(f"skinny kernel: {skinny.unavailable_reason()}")
    res = main(["--shape", "tiny", "--quick", "--device", "cpu", "--kernel", "torch", "--weights", "q8_0",
                "--prefill", "300", "--out", str(tmp_path / "speed"), "--cache-dir", str(tmp_path / "cache")])
    h = res["header"]
    roof, qb = h["roofline"], h["quant_bytes"]
    kind = skinny.int8_kind()
    assert h["weights"] == "q8_0" and list(roof["int8_peak_gops"]) == [kind] and roof["int8_peak_gops"][kind] > 0
    assert h["weight_bytes"] == qb["products"] + qb["other"] == 382_976 + 2_560
    # K and V, layers, kv heads, head_dim, fp16 (the cache beside quantized products: Transformer.kv_cache_dtype)
    kv_key = 2 * 2 * 2 * 32 * (2 if skinny.kv16_available() else 4)
    assert h["kv_bytes_per_token"] == kv_key
    layer, head = h["layer_flops_per_row"], h["head_flops_per_row"]
    int8, fp32 = roof["int8_peak_gops"][kind], max(roof["peak_gflops"].values())
    rows = [dict(r, step_tokens=1) for r in res["decode"]] + res["step_cost"]
    for r in rows:
        n = r["batch"] * r["step_tokens"]
        keys = r["batch"] * (64 + r["step_tokens"])  # context 64 (--quick)
        attention = 4 * 2 * 4 * 32 * n * (64 + r["step_tokens"])
        wbytes = h["weight_bytes"] + n * 512
        floor = max((wbytes + keys * kv_key) / (r["bandwidth_gbs"] * 1e9),
                    n * (layer + head) / (int8 * 1e9) + attention / (fp32 * 1e9)) * 1e3
        assert r["int8_peak"] == kind and r["floor_weight_bytes"] == wbytes and r["floor_kv_bytes"] == keys * kv_key
        assert r["roofline_ms"] == pytest.approx(floor) and r["vs_roofline"] == pytest.approx(r["forward_ms"] / floor)
    (p,) = res["prefill"]
    chunks = -(-300 // p["chunk"])
    assert p["floor_weight_bytes"] == chunks * h["weight_bytes"] + 300 * 512
    md = (tmp_path / "speed" / "model_speed.md").read_text()
    assert "weights q8_0 (q8_0 360,448 weights at 1.062 B/weight)" in md and f"{kind} " in md


def test_weights_native_means_the_default_model_file(capsys):
    from bench.model_speed import parse_args

    args = parse_args(["--weights", "native"])
    assert args.model == "smollm2" and args.shape == "smollm2-135m"
    assert parse_args(["--shape", "tiny"]).weights is None and parse_args(["--shape", "tiny"]).model is None
    with pytest.raises(SystemExit):
        parse_args(["--weights", "q4"])
