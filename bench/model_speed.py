"""Model-level speed with random weights: decode bandwidth and the step-cost curve.

    python bench/model_speed.py                        # GPU: Mistral-7B shape, bf16, triton kernels
    python bench/model_speed.py --shape tiny --quick   # CPU smoke run (what the test runs)

Two measurements on the same model in one run (the weights are random: speed does not
depend on them, and nothing has to be downloaded):

* decode -- one-token steps at batch 1, 2, ..., 64 over a ``--context``-token prefix per
  sequence: ms per step, tokens/s, and achieved weight bandwidth = weight bytes / step time
  (also with the K/V bytes read), as a fraction of the device copy bandwidth measured in
  the same run (``dst.copy_(src)``, read + write counted).
* step cost -- one step of T tokens per sequence (T = 1, 2, 4, ..., 128; a random draft
  tree's visibility mask, as speculative methods send) at batch 1 and 8, relative to a
  one-token step. This curve says how many draft tokens a step can afford to verify.

Each is timed twice: ``forward`` = the model on prepared device tensors (what a CUDA graph
would replay) and ``step`` = ``ModelRunner.step`` including the host-side packing that the
decoding loop pays today. Writes OUT/model_speed.json, OUT/model_speed.md and
OUT/step_cost.png. On a CPU the numbers describe this CPU only.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before `kernels` is imported
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.backend import TorchBackend, get_backend, triton_interpreted  # noqa: E402
from models.config import ModelConfig  # noqa: E402
from models.cost import random_tree  # noqa: E402
from models.linear import Linear  # noqa: E402
from models.llama import Transformer, rope_inv_freq  # noqa: E402
from models.loader import DEFAULT_CACHE_DIR  # noqa: E402
from models.runner import ModelRunner, StepInput  # noqa: E402
from models.tune import tune_model  # noqa: E402
from decoding.generate import default_prefill_chunk  # noqa: E402

SHAPES = {
    # Mistral-7B-v0.1 (the sliding window is longer than any context used here).
    "mistral-7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_layers=32,
                       num_heads=32, num_kv_heads=8, max_position_embeddings=32768),
    # The embedded default model (SmolLM2-135M).
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                         num_heads=9, num_kv_heads=3, max_position_embeddings=8192, tie_word_embeddings=True),
    # Small enough for interpreted Triton on a CPU.
    "tiny": dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
                 num_kv_heads=2, max_position_embeddings=4096),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return vals


def random_model(cfg: ModelConfig, backend, dtype: torch.dtype, device: torch.device, seed: int = 0) -> Transformer:
    """A model of ``cfg``'s shape with small random weights, built directly on ``device``."""
    with torch.device("meta"):
        model = Transformer(cfg, backend).to(dtype)  # no memory yet: 7B never exists in fp32
    model = model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norms and biases
                p.fill_(1.0 if "norm" in name else 0.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    model.inv_freq = rope_inv_freq(cfg).to(device)  # buffers were left empty by to_empty
    return model.eval()


def weight_bytes(model: Transformer) -> int:
    """Weight bytes one step must read: every parameter once, except an untied embedding
    table, of which a step reads only its tokens' rows (tied: read in full as the LM head)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if model.lm_head is not None:
        total -= model.embed.weight.numel() * model.embed.weight.element_size()
    return total


def weight_format(model: Transformer) -> str:
    """"fp32" for a model whose products multiply its parameters; else the ``weights`` its
    products were quantized with (models/loader.py quantize_model: "q8_0", "native")."""
    if model.head_quant is None and not any(getattr(m, "quant", None) is not None for m in model.modules()):
        return "fp32"
    return getattr(model, "weights", None) or "quantized"


def quant_bytes(model: Transformer) -> dict:
    """What one step of a model with block-quantized products reads of its weights, by part:
    ``products`` the packed Q4_1 / Q8_0 weights of every layer product and the LM head as stored
    (kernels/quant.py: 20 bytes per 32 weights for Q4_1, 34 for Q8_0, rows padded to panels of
    16), ``other`` the remaining parameters (norms, biases) read whole, ``embed_row`` the bytes of
    one embedding row (a step reads its tokens' rows only: the table stays fp32, the LM head has
    its own packed copy); ``formats`` format -> (weights, bytes)."""
    packed = [m.quant for m in model.modules() if isinstance(m, Linear) and m.quant is not None]
    if model.lm_head is None and model.head_quant is not None:  # tied: the head is a packed copy of the table
        packed.append(model.head_quant)
    formats: dict = {}
    for w in packed:
        n, k = w.shape
        weights, nbytes = formats.get(w.format, (0, 0))
        formats[w.format] = (weights + n * k, nbytes + w.nbytes)
    embed = model.embed.weight
    other = sum(p.numel() * p.element_size() for p in model.parameters()
                if p.device.type != "meta" and p is not embed)
    return dict(products=sum(w.nbytes for w in packed), other=other,
                embed_row=embed.shape[1] * embed.element_size(), formats=formats)


def int8_kind_for(isa: Optional[str]) -> Optional[str]:
    """The form of the int8 dot products (kernels/skinny.py INT8_PEAKS) that ``isa``'s build of
    the quantized products takes (None: the active build's)."""
    from kernels import skinny
    if isa is None:
        return skinny.int8_kind()
    if isa == "avx512":
        return "vnni512" if "avx512_vnni" in skinny.cpu_flags() else "maddubs512"
    return "maddubs256"


def make_timer(device: torch.device, reps: int):
    def run(fn) -> float:  # median ms
        fn()
        fn()  # warm-up (Triton compiles on the first call)
        if device.type == "cuda":
            import triton
            return float(triton.testing.do_bench(fn, warmup=5, rep=max(20, reps * 10), return_mode="median"))
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3
    return run


def product_flops(model: Transformer) -> tuple[int, int]:
    """(flops of one step row through every layer's products, flops of one logits row of the LM
    head): 2 per weight."""
    layers = sum(2 * m.weight.numel() for layer in model.layers for m in layer.modules() if isinstance(m, Linear))
    return layers, 2 * model.head_weight.numel()


def attention_flops(cfg: ModelConfig, rows: int, keys: int) -> int:
    """Flops of attention for ``rows`` step rows over ``keys`` keys each, every layer: q k^T and
    p v, 2 flops per multiply-add (what the kernels compute: a tree's hidden keys are masked,
    not skipped)."""
    return 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * rows * keys


def roofline(device: torch.device, dtype: torch.dtype, timer, copy_gbs: float,
             int8_kinds: tuple = ()) -> dict:
    """The machine's roofline, measured now: the peak rate of the step's arithmetic and the
    memory bandwidth weights stream at. CPU (fp32): the FMA peak at each vector width the CPU
    has and the read bandwidth, every thread (kernels/cpu/roofline.c); GPU: a large matrix
    product in ``dtype`` and the copy bandwidth. ``int8_kinds``: the int8 dot products' forms
    (kernels/skinny.py INT8_PEAKS) whose peak to measure too, for quantized products."""
    if device.type == "cuda":
        n = 8192
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        ms = timer(lambda: a @ b)
        return dict(peak_gflops={"matmul": 2 * n ** 3 / (ms * 1e-3) / 1e9}, bandwidth_gbs=copy_gbs,
                    bandwidth_from="copy bandwidth (read + write counted)")
    from kernels import skinny
    if not skinny.available():
        return dict(peak_gflops={}, bandwidth_gbs=copy_gbs, bandwidth_from="copy bandwidth (read + write counted)",
                    note=f"no FMA probe: {skinny.unavailable_reason()}")
    widths = [256] + ([512] if "avx512f" in skinny.cpu_flags() else [])
    peaks = {str(bits): max(skinny.fma_peak_gflops(bits) for _ in range(3)) for bits in widths}
    buf = torch.ones(128 << 20)  # 512 MB, far past the caches
    read = max(skinny.read_bandwidth_gbs(buf) for _ in range(3))
    del buf
    out = dict(peak_gflops=peaks, bandwidth_gbs=read, bandwidth_from="read bandwidth (8 streams per thread)",
               threads=torch.get_num_threads(), isa=skinny.isa())
    if int8_kinds:
        out["int8_peak_gops"] = {k: max(skinny.int8_peak_gops(k) for _ in range(3)) for k in int8_kinds}
    return out


def against_roofline(ms: float, wbytes: int, flops: int, roof: dict) -> dict:
    """A forward of ``flops`` reading ``wbytes`` of weights in ``ms``, against the roofline: its
    floor (the larger of the weights' time at the bandwidth and the flops' at the best peak),
    the forward as a multiple of it, and its rate as a share of the peak."""
    peak = max(roof["peak_gflops"].values(), default=0.0)
    mem_ms = wbytes / (roof["bandwidth_gbs"] * 1e9) * 1e3
    flop_ms = flops / (peak * 1e9) * 1e3 if peak else 0.0
    floor = max(mem_ms, flop_ms)
    return dict(flops=flops, gflops=flops / (ms * 1e-3) / 1e9, roofline_ms=floor,
                vs_roofline=ms / floor, peak_frac=(flops / (ms * 1e-3) / 1e9 / peak) if peak else None,
                bound="memory" if mem_ms >= flop_ms else "compute")


def against_quant_roofline(ms: float, wbytes: int, kv_bytes: int, quant_flops: int, attn_flops: int, roof: dict,
                           int8_kind: str) -> dict:
    """``against_roofline`` for a forward whose products run on block-quantized weights: its
    floor is the larger of (the weights' bytes as stored + the K/V bytes its attention reads) at
    the read bandwidth and (the products' flops at the int8 dot products' peak, ``int8_kind``'s,
    + attention's at the best fp32 peak); the share of peak is that compute floor over ``ms``."""
    int8 = roof["int8_peak_gops"][int8_kind]
    fp32 = max(roof["peak_gflops"].values())
    mem_ms = (wbytes + kv_bytes) / (roof["bandwidth_gbs"] * 1e9) * 1e3
    flop_ms = (quant_flops / (int8 * 1e9) + attn_flops / (fp32 * 1e9)) * 1e3
    floor = max(mem_ms, flop_ms)
    flops = quant_flops + attn_flops
    return dict(flops=flops, gflops=flops / (ms * 1e-3) / 1e9, roofline_ms=floor, vs_roofline=ms / floor,
                peak_frac=flop_ms / ms, bound="memory" if mem_ms >= flop_ms else "compute",
                floor_weight_bytes=wbytes, floor_kv_bytes=kv_bytes, int8_peak=int8_kind)


def copy_bandwidth(device: torch.device, timer, nbytes: int) -> float:
    """Device copy bandwidth in GB/s, read + write counted."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


class _PerLayerTorch(TorchBackend):
    """The torch backend without its per-step plan: every layer redoes the step's attention
    bookkeeping, as the forward did before plans existed."""

    def plan(self, meta, block_size, sliding_window):
        return None


@contextmanager
def baseline_forward(model: Transformer):
    """The previous forward's structure: every product plain F.linear, attention worked out
    per layer (torch backend). Restores the model afterwards."""
    saved = [(m, m.plan) for m in model.modules() if isinstance(m, Linear)]
    head, backend = model.head_plan, model.backend
    try:
        for m, _ in saved:
            m.plan = None
        model.head_plan = None
        if isinstance(backend, TorchBackend):
            model.backend = _PerLayerTorch()
        yield
    finally:
        for m, p in saved:
            m.plan = p
        model.head_plan, model.backend = head, backend


def setup_batch(runner: ModelRunner, batch: int, context: int) -> list[int]:
    """``batch`` sequences with ``context`` committed tokens each (their K/V are whatever the
    pool holds: attention cost does not depend on the values)."""
    for s in runner.seq_ids:
        runner.free(s)
    for s in range(batch):
        runner.add_sequence(s)
        runner.assume_context(s, context)
    return list(range(batch))


def measure(args) -> dict:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = DTYPES[args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    kernel = args.kernel or ("triton" if device.type == "cuda" else "torch")
    backend = get_backend(kernel, device, exact=args.exact)
    if args.model is not None:  # a real model (its shape, its file's blocks with --weights native)
        from models.loader import load_model
        model = load_model(args.model, backend=backend, dtype=dtype, device=device, tune=False,
                           weights=args.weights).model
        cfg = model.cfg
    else:
        cfg = ModelConfig(**SHAPES[args.shape])
        model = random_model(cfg, backend, dtype, device)
        if args.weights not in (None, "fp32"):  # q8_0 from the random fp32 weights
            from models.loader import quantize_model, resolve_weights
            quantize_model(model, resolve_weights(args.weights, dtype, device))
    fmt = weight_format(model)
    qb = quant_bytes(model) if fmt != "fp32" else None
    max_batch = max(max(args.batch), max(args.step_batch))
    per_seq = args.context + max(args.step_tokens) + 16
    runner = ModelRunner(model, cache_tokens=max(max_batch * (per_seq + 16), args.prefill + 64), block_size=16,
                         graphs=args.cuda_graphs)
    timer = make_timer(device, args.reps)
    wbytes = weight_bytes(model) if qb is None else qb["products"] + qb["other"]  # embedding rows: per step
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * runner.cache.k.element_size()
    vocab = cfg.vocab_size
    gen = torch.Generator().manual_seed(0)
    copy_gbs = copy_bandwidth(device, timer, args.copy_mb << 20)
    int8_kinds = ()
    if qb is not None:
        int8_kinds = tuple(dict.fromkeys(int8_kind_for(i) for i in (args.isa or [None])))
    roof = roofline(device, dtype, timer, copy_gbs, int8_kinds)
    # On a CPU the read bandwidth is measured again beside every point: on a shared host it
    # switches between states (here 30-35 and 50-80 GB/s) within minutes, and a memory-bound
    # point's floor must use the state the point ran in.
    probe = None
    if device.type == "cpu" and "threads" in roof:
        from kernels import skinny
        probe_buf = torch.ones(64 << 20)  # 256 MB, past the caches

        def probe() -> dict:
            return dict(roof, bandwidth_gbs=max(skinny.read_bandwidth_gbs(probe_buf) for _ in range(2)))
    layer_flops, head_flops = product_flops(model)

    def floor(ms: float, rows: int, keys: int, quant_flops: int, attn_flops: int, here: dict, isa,
              passes: int = 1) -> dict:
        """The point against the roofline: ``rows`` step rows through the products, ``keys``
        keys read by its attention (all sequences), the weights read ``passes`` times. fp32: the
        weights' bytes at the bandwidth vs all flops at the best fp32 peak (as always);
        quantized: ``against_quant_roofline``."""
        if qb is None:
            return against_roofline(ms, passes * wbytes, quant_flops + attn_flops, here)
        return against_quant_roofline(ms, passes * wbytes + rows * qb["embed_row"], keys * kv_per_token,
                                      quant_flops, attn_flops, here, int8_kind_for(isa))

    isas = args.isa or [None]  # CPU builds to time side by side (kernels/skinny.py), None: the active one
    tables = {}

    def use(isa) -> None:
        """Switch to ``isa``'s build and install its product plans (tuned once per build)."""
        if isa is not None:
            from kernels import skinny
            skinny.use_isa(isa)
        if not args.no_tune:
            tables[isa or "default"] = tune_model(model, args.cache_dir, args.extra_weight_memory)

    for isa in isas:  # tune every build before anything is timed
        use(isa)

    greedy_ms: list = [None]  # timed() also leaves the greedy forward's ms here (None: no head screen)

    def timed(inputs: list[StepInput], isa, first: bool) -> tuple[float, float, Optional[float], Optional[float],
                                                                   Optional[bool]]:
        """(forward ms, runner step ms, baseline forward ms (the first build only), replayed
        forward ms, whether it replayed); the last two None without graphs. The replayed forward
        is ``ModelRunner.forward`` on the prepared step: the static inputs filled, the graph
        replayed, the logits copied out (a step too large for a graph runs eagerly there)."""
        if len(isas) > 1:
            use(isa)
        tokens, meta, idx = runner.prepare(inputs)
        replay = replayed = base_fwd = None
        with torch.inference_mode():
            fwd = timer(lambda: model(tokens, meta, runner.cache.k, runner.cache.v, idx))
            if first:
                with baseline_forward(model):
                    base_fwd = timer(lambda: model(tokens, meta, runner.cache.k, runner.cache.v, idx))
            if runner.graphs is not None:
                eager_before = runner.graphs.stats["eager"]
                replay = timer(lambda: runner.forward(tokens, meta, idx))
                replayed = runner.graphs.stats["eager"] == eager_before and runner.graphs.failed is None
        step = timer(lambda: runner.step(inputs))
        # a greedy step's forward where the LM head is screened, not multiplied out (ModelRunner.step_greedy)
        greedy_ms[0] = timer(lambda: runner.forward_greedy(tokens, meta, idx)) if runner.head_screen() else None
        return fwd, step, base_fwd, replay, replayed

    def phases(inputs: list[StepInput]) -> Optional[dict]:
        """Where a forward's time goes (ms), from the fastest of ``--reps`` more forwards: the
        one-call layer stack's phases (kernels/skinny.py stack_profile) and the rest of the
        forward (embedding, the step's attention plan, the final norm and the logits product,
        Python); None where the stack did not run (another device or dtype, a product not
        planned ``skinny``)."""
        if device.type != "cpu":
            return None
        from kernels import skinny
        if not skinny.available():
            return None
        tokens, meta, idx = runner.prepare(inputs)
        best = None
        for _ in range(args.reps):  # the split of the fastest of as many forwards as the timings take
            with torch.inference_mode(), skinny.stack_profile() as ph:
                t = time.perf_counter()
                model(tokens, meta, runner.cache.k, runner.cache.v, idx)
                wall = time.perf_counter() - t
            if not any(ph.values()):
                return None
            if best is None or wall < best[0]:
                best = (wall, ph)
        wall, ph = best
        out = {k: 1e3 * v for k, v in ph.items()}
        out["outside"] = 1e3 * wall - sum(out.values())
        return out

    decode = []
    bar = _progress((len(args.batch) + len(args.step_batch) * len(args.step_tokens)) * len(isas))
    for b in args.batch:
        seqs = setup_batch(runner, b, args.context)
        inputs = [StepInput(s, [int(torch.randint(0, vocab, (1,), generator=gen))]) for s in seqs]
        base_fwd = None
        for i, isa in enumerate(isas):  # the builds back to back at each point: the machine's drift falls on both
            fwd, step, bf, replay, replayed = timed(inputs, isa, i == 0)
            base_fwd = bf if i == 0 else base_fwd
            kv_bytes = b * args.context * kv_per_token
            here = probe() if probe else roof
            row = dict(batch=b, context=args.context, forward_ms=fwd, step_ms=step, baseline_ms=base_fwd,
                       tok_s=b / (fwd * 1e-3), weight_gbs=wbytes / (fwd * 1e-3) / 1e9,
                       weight_kv_gbs=(wbytes + kv_bytes) / (fwd * 1e-3) / 1e9,
                       weight_bw_frac=wbytes / (fwd * 1e-3) / 1e9 / copy_gbs, isa=isa,
                       **floor(fwd, b, b * (args.context + 1), b * (layer_flops + head_flops),
                               attention_flops(cfg, b, args.context + 1), here, isa),
                       bandwidth_gbs=here["bandwidth_gbs"])
            if replay is not None:
                row.update(replay_ms=replay, replayed=replayed, graph_speedup=fwd / replay,
                           replay_tok_s=b / (replay * 1e-3), replay_weight_gbs=wbytes / (replay * 1e-3) / 1e9,
                           replay_bw_frac=wbytes / (replay * 1e-3) / 1e9 / copy_gbs)
            decode.append(row)
            bar.update()

    curve = []
    for b in args.step_batch:
        seqs = setup_batch(runner, b, args.context)
        base = {}
        for T in args.step_tokens:
            inputs = []
            for s in seqs:
                depth, mask = random_tree(T, gen)
                toks = torch.randint(0, vocab, (T,), generator=gen).tolist()
                inputs.append(StepInput(s, toks, depths=depth, mask=None if T == 1 else mask))
            base_fwd = None
            for i, isa in enumerate(isas):
                fwd, step, bf, replay, replayed = timed(inputs, isa, i == 0)
                base_fwd = bf if i == 0 else base_fwd
                first = base.setdefault(isa, (fwd, step, base_fwd, replay))
                here = probe() if probe else roof
                row = dict(batch=b, step_tokens=T, context=args.context, forward_ms=fwd, step_ms=step,
                           forward_rel=fwd / first[0], step_rel=step / first[1], baseline_ms=base_fwd,
                           baseline_rel=base_fwd / base[isas[0]][2], isa=isa,
                           **floor(fwd, b * T, b * (args.context + T), b * T * (layer_flops + head_flops),
                                   attention_flops(cfg, b * T, args.context + T), here, isa),
                           bandwidth_gbs=here["bandwidth_gbs"])
                if replay is not None:
                    row.update(replay_ms=replay, replay_rel=replay / first[3], replayed=replayed)
                if greedy_ms[0] is not None:
                    row.update(greedy_ms=greedy_ms[0], greedy_vs_roofline=greedy_ms[0] / row["roofline_ms"])
                split = phases(inputs)
                if split is not None:
                    row["stack_phases_ms"] = split
                curve.append(row)
                bar.update()
    bar.close()

    prefill = []
    if args.prefill:
        # a prompt of --prefill tokens through the runner in causal chunks (as decoding.generate
        # prefills: its default chunk on the device), each build in turn, interleaved rounds,
        # each build's fastest; the weights are read once per chunk
        n, chunk = args.prefill, default_prefill_chunk(device)
        prompt = torch.randint(0, vocab, (n,), generator=gen).tolist()
        chunks = -(-n // chunk)
        attn = attention_flops(cfg, 1, 1) * n * (n + 1) // 2
        keys = sum(min(n, (c + 1) * chunk) for c in range(chunks))  # each chunk reads the keys up to its end
        best = {}
        for _ in range(min(args.reps, 3)):
            for isa in isas:
                if len(isas) > 1:
                    use(isa)
                setup_batch(runner, 1, 0)
                with torch.inference_mode():
                    t = time.perf_counter()
                    for c in range(chunks):
                        piece = prompt[c * chunk:(c + 1) * chunk]
                        last = (c + 1) * chunk >= n
                        runner.step([StepInput(0, piece, logits_rows=[len(piece) - 1] if last else [])])
                        runner.commit({0: list(range(len(piece)))})
                    best[isa] = min(best.get(isa, float("inf")), (time.perf_counter() - t) * 1e3)
        for isa in isas:
            here = probe() if probe else roof
            prefill.append(dict(tokens=n, chunk=chunk, ms=best[isa], tok_s=n / (best[isa] * 1e-3), isa=isa,
                                bandwidth_gbs=here["bandwidth_gbs"],
                                **floor(best[isa], n, keys, n * layer_flops + head_flops, attn, here, isa,
                                        passes=chunks)))

    import triton
    return dict(
        header=dict(device=_device_name(device), dtype=str(dtype).removeprefix("torch."), kernel=kernel,
                    triton_interpreted=kernel == "triton" and triton_interpreted(),
                    shape=args.shape if args.model is None else args.model,  # a real model's own config
                    config={k: getattr(cfg, k) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                         "num_layers", "num_heads", "num_kv_heads", "head_dim")},
                    weight_bytes=wbytes, weights=fmt, quant_bytes=qb, model=args.model,
                    kv_bytes_per_token=kv_per_token, copy_gbs=copy_gbs, roofline=roof, layer_flops_per_row=layer_flops,
                    head_flops_per_row=head_flops, isas=isas,
                    product_tables=(tables.get("default") if isas == [None] else tables) if tables else None,
                    torch=torch.__version__, triton=triton.__version__,
                    python=platform.python_version(), command=" ".join(sys.argv),
                    cuda_graphs=bool(args.cuda_graphs), exact=bool(args.exact),
                    graph_stats=None if runner.graphs is None
                    else dict(runner.graphs.stats, failed=runner.graphs.failed)),
        decode=decode, step_cost=curve, prefill=prefill)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from models.machine import cpu_model
    return f"CPU ({cpu_model()}, {torch.get_num_threads()} threads)"


def _progress(total: int):
    from tqdm import tqdm
    return tqdm(total=total, desc="measurements", file=sys.stderr)


def markdown(res: dict) -> str:
    h = res["header"]
    fmt = "fp32" if h.get("weights", "fp32") == "fp32" else _format_text(h)
    what = f"weights {fmt}" if h.get("model") else "random weights" + ("" if fmt == "fp32" else f", weights {fmt}")
    lines = [f"# Model speed: {h.get('model') or h['shape']} ({what})", "",
             f"device {h['device']}, dtype {h['dtype']}, kernels {h['kernel']}"
             f"{' (exact path: kernels/exact_linear.py products, exact attention)' if h.get('exact') else ''}"
             f"{' (Triton interpreted: not a speed measurement)' if h['triton_interpreted'] else ''}, "
             f"torch {h['torch']}, triton {h['triton']}; weights {h['weight_bytes'] / 1e9:.3f} GB; "
             f"copy bandwidth {h['copy_gbs']:.0f} GB/s (read + write)", "",
             f"`{h['command']}`", "",
             "forward: the model as it runs (tuned products, per-step attention plan); baseline: every product "
             "plain F.linear and attention worked out per layer (the previous forward), same weights, same run; "
             "step: `ModelRunner.step`, host packing included"
             + (", replayed from CUDA graphs." if h.get("cuda_graphs") else ", eager.") , "",
             _roofline_line(h), "",
             "## Decode (one token per sequence)", "",
             "| batch | context | forward ms | baseline ms | speedup | step ms | tok/s | weight GB/s | weight+KV GB/s "
             "| weight BW / copy BW |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["decode"]:
        lines.append(f"| {_b(r)} | {r['context']} | {r['forward_ms']:.3f} | {r['baseline_ms']:.3f} "
                     f"| {r['baseline_ms'] / r['forward_ms']:.2f} | {r['step_ms']:.3f} | "
                     f"{r['tok_s']:.1f} | {r['weight_gbs']:.1f} | {r['weight_kv_gbs']:.1f} | "
                     f"{100 * r['weight_bw_frac']:.1f}% |")
    lines += ["", "## Step cost vs step tokens (random draft trees)", "",
              "| batch | step tokens | forward ms | x one-token forward | baseline ms | baseline x one-token | "
              "step ms | x one-token step |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["step_cost"]:
        lines.append(f"| {_b(r)} | {r['step_tokens']} | {r['forward_ms']:.3f} | {r['forward_rel']:.2f} | "
                     f"{r['baseline_ms']:.3f} | {r['baseline_rel']:.2f} | {r['step_ms']:.3f} | {r['step_rel']:.2f} |")
    lines += _roofline_table(res)
    lines += _phase_table(res)
    if res.get("prefill"):
        lines += ["", "## Prefill (one prompt, causal chunks)", "",
                  f"`ModelRunner.step` over chunks of {res['prefill'][0]['chunk']} tokens, committed; the fastest "
                  "of up to 3 interleaved rounds; floor: the weights read once per chunk at the read bandwidth vs "
                  "the products' and causal attention's flops at the best peak"
                  + (" (quantized: + the prompt's embedding rows and each chunk's keys and values read, the "
                     "products' flops at the int8 peak)." if h.get("quant_bytes") else "."), "",
                  "| build | tokens | ms | tokens/s | read GB/s | floor ms | bound | ms / floor | GFLOP/s "
                  "| share of peak |",
                  "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
        for r in res["prefill"]:
            share = "" if r["peak_frac"] is None else f"{100 * r['peak_frac']:.0f}%"
            lines.append(f"| {r.get('isa') or 'active'} | {r['tokens']} | {r['ms']:.0f} | {r['tok_s']:.0f} | "
                         f"{r['bandwidth_gbs']:.1f} | {r['roofline_ms']:.0f} | {r['bound']} | {r['vs_roofline']:.2f} | "
                         f"{r['gflops']:.0f} | {share} |")
    if any("replay_ms" in r for r in res["decode"] + res["step_cost"]):
        g = h.get("graph_stats") or {}
        lines += ["", "## Replayed from CUDA graphs", "",
                  "replayed: `ModelRunner.forward` on the prepared step (static inputs filled, graph replayed, logits "
                  "copied out); eager: the forward column above. A step over the graphs' size limit runs eagerly "
                  f"(replayed: no). Graphs: {g.get('captures', 0)} captured, {g.get('replays', 0)} replays, "
                  f"{g.get('eager', 0)} eager steps" + (f"; capture failed: {g['failed']}" if g.get("failed") else "")
                  + ".", "",
                  "| batch | step tokens | eager ms | replayed ms | eager / replayed | replayed x one-token | tok/s "
                  "| weight BW / copy BW | replayed |", "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in res["decode"]:
            if "replay_ms" in r:
                lines.append(f"| {r['batch']} | 1 | {r['forward_ms']:.3f} | {r['replay_ms']:.3f} | "
                             f"{r['graph_speedup']:.2f} | | {r['replay_tok_s']:.1f} | {100 * r['replay_bw_frac']:.1f}% "
                             f"| {'yes' if r['replayed'] else 'no'} |")
        for r in res["step_cost"]:
            if "replay_ms" in r:
                lines.append(f"| {r['batch']} | {r['step_tokens']} | {r['forward_ms']:.3f} | {r['replay_ms']:.3f} | "
                             f"{r['forward_ms'] / r['replay_ms']:.2f} | {r['replay_rel']:.2f} | | | "
                             f"{'yes' if r['replayed'] else 'no'} |")
    return "\n".join(lines) + "\n"


def _b(r: dict) -> str:
    """A row's batch, with its CPU build where several were timed."""
    return f"{r['batch']} ({r['isa']})" if r.get("isa") else str(r["batch"])


def _format_text(h: dict) -> str:
    """The weights' format and what a step reads of them, e.g. "native (q4_1 0.625 B/weight, ...)"."""
    qb = h.get("quant_bytes") or {}
    parts = [f"{f} {n:,} weights at {b / n:.4g} B/weight" for f, (n, b) in sorted(qb.get("formats", {}).items())]
    return f"{h.get('weights')} ({'; '.join(parts)})" if parts else str(h.get("weights"))


def _roofline_line(h: dict) -> str:
    r = h.get("roofline") or {}
    if h.get("quant_bytes"):
        qb = h["quant_bytes"]
        fp32 = max(r.get("peak_gflops", {}).values(), default=0.0)
        int8 = ", ".join(f"{k} {v:.0f} GOP/s" for k, v in r.get("int8_peak_gops", {}).items())
        return (f"roofline (measured in this run): int8 dot-product peak {int8 or 'not measured'} (the quantized "
                f"products' form: vnni512 = vpdpbusd, maddubs* = maddubs + madd without VNNI); fp32 FMA peak "
                f"{fp32:.0f} GFLOP/s; {r.get('bandwidth_from', 'bandwidth')} {r.get('bandwidth_gbs', 0):.1f} GB/s. "
                f"Weights {_format_text(h)}: {qb['products'] / 1e6:.1f} MB of packed products (LM head included) "
                f"+ {qb['other'] / 1e6:.2f} MB of norms and biases + {qb['embed_row']} bytes of embedding per "
                f"step row; K/V {h['kv_bytes_per_token']} bytes per key (all layers). A step's floor: the larger "
                f"of (those weight bytes + the K/V bytes of the keys its attention reads, at the read bandwidth) "
                f"and (the products' {h.get('layer_flops_per_row', 0) / 1e6:.0f} MFLOP per step row + "
                f"{h.get('head_flops_per_row', 0) / 1e6:.0f} per logits row at the int8 peak + attention's flops "
                "(4 x layers x heads x head_dim per row and key) at the fp32 peak); share of peak: that compute "
                "time over the forward's. On a CPU the read bandwidth is measured again beside every point.")
    peaks = ", ".join(f"{k}{'-bit FMA' if k.isdigit() else ''} {v:.0f} GFLOP/s"
                      for k, v in r.get("peak_gflops", {}).items())
    return (f"roofline (measured in this run): peak {peaks or 'not measured'}; {r.get('bandwidth_from', 'bandwidth')} "
            f"{r.get('bandwidth_gbs', 0):.1f} GB/s; products {h.get('layer_flops_per_row', 0) / 1e6:.0f} MFLOP "
            f"per step row + {h.get('head_flops_per_row', 0) / 1e6:.0f} per logits row, + attention (4 x layers x "
            "heads x head_dim per row and key). A step's floor: the larger of its weight bytes at that bandwidth "
            "and its flops at the best peak"
            + ("; on a CPU the read bandwidth is measured again beside every point (its column below), and that "
               "point's floor uses it." if r.get("threads") else "."))


def _roofline_table(res: dict) -> list[str]:
    lines = ["", "## Against the roofline", "",
             "| build | batch | step tokens | forward ms | read GB/s | floor ms | bound | forward / floor | GFLOP/s "
             "| share of peak |",
             "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    rows = [dict(r, step_tokens=1) for r in res["decode"]] + res["step_cost"]
    greedy = [r for r in rows if r.get("greedy_ms") is not None]
    if greedy:  # a greedy step's forward, with the LM head screened in bf16 (kernels/skinny.py head_topk)
        lines[-2] = lines[-2].replace("| forward / floor |", "| forward / floor | greedy forward ms | greedy / floor |")
        lines[-1] += "---:|---:|"
    for r in rows:
        if "roofline_ms" not in r:
            continue
        share = "" if r["peak_frac"] is None else f"{100 * r['peak_frac']:.0f}%"
        bw = r.get("bandwidth_gbs", res["header"]["roofline"]["bandwidth_gbs"])
        g = (f" {r['greedy_ms']:.2f} | {r['greedy_vs_roofline']:.2f} |" if r.get("greedy_ms") is not None
             else " | |") if greedy else ""
        lines.append(f"| {r.get('isa') or 'active'} | {r['batch']} | {r['step_tokens']} | {r['forward_ms']:.2f} | "
                     f"{bw:.1f} | {r['roofline_ms']:.2f} | {r['bound']} | {r['vs_roofline']:.2f} |{g} "
                     f"{r['gflops']:.0f} | {share} |")
    if greedy:
        lines += ["", "greedy forward: what a greedy step's forward costs (`ModelRunner.forward_greedy`): the LM "
                      "head screened in bf16 for each row's argmax instead of its logits multiplied out; its floor "
                      "is the same fp32 floor."]
    return lines


def _phase_table(res: dict) -> list[str]:
    """ms per forward in each phase of the one-call layer stack (one more forward, profiled),
    "outside" the rest of the forward (embedding, plan, final norm, logits product, Python)."""
    rows = [r for r in res["step_cost"] if r.get("stack_phases_ms")]
    if not rows:
        return []
    from kernels.skinny import STACK_PHASES
    cols = list(STACK_PHASES) + ["outside"]
    return (["", "## Where a forward's time goes (ms: the layer stack's phases, fastest profiled forward)", "",
             "products: qkv, o, gate_up, down (all layers); outside: embedding, attention plan, final norm, logits "
             "product, Python.", "",
             "| build | batch | step tokens | " + " | ".join(cols) + " | products GFLOP/s |",
             "|---|---:|---:|" + "---:|" * (len(cols) + 1)]
            + [f"| {r.get('isa') or 'active'} | {r['batch']} | {r['step_tokens']} | "
               + " | ".join(f"{r['stack_phases_ms'][c]:.2f}" for c in cols)
               + f" | {_stack_gflops(res, r):.0f} |" for r in rows])


def _stack_gflops(res: dict, r: dict) -> float:
    ms = sum(r["stack_phases_ms"][c] for c in ("qkv", "o", "gate_up", "down"))
    return res["header"]["layer_flops_per_row"] * r["batch"] * r["step_tokens"] / (ms * 1e-3) / 1e9 if ms else 0.0


def chart(res: dict, path: Path) -> Optional[Path]:
    from bench.report import pyplot
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for b in sorted({r["batch"] for r in res["step_cost"]}):
        rows = [r for r in res["step_cost"] if r["batch"] == b]
        ax.plot([r["step_tokens"] for r in rows], [r["forward_rel"] for r in rows], "o-", label=f"batch {b}")
        ax.plot([r["step_tokens"] for r in rows], [r["baseline_rel"] for r in rows], "x--", alpha=0.6,
                label=f"batch {b}, baseline")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("step tokens per sequence")
    ax.set_ylabel("forward time / one-token forward")
    h = res["header"]
    ax.set_title(f"{h['shape']}, {h['dtype']}, {h['kernel']} on {h['device']}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default=None,
                   help="model shape (default: mistral-7b on a GPU, smollm2-135m on a CPU)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 on a GPU, fp32 on a CPU")
    p.add_argument("--kernel", choices=["triton", "torch"], default=None,
                   help="default: triton on a GPU, torch on a CPU")
    p.add_argument("--weights", choices=("fp32", "q8_0", "native"), default=None,
                   help="the products' weights (models/loader.py): fp32, q8_0 (quantized from fp32) or native "
                        "(a GGUF file's own Q4_1 / Q8_0 blocks: the default model's file unless --model names "
                        "another); default: load_model's with --model, else fp32 (random weights)")
    p.add_argument("--model", default=None,
                   help="time a real model (load_model's name: smollm2, a .gguf file, an HF folder) instead of "
                        "random weights at --shape; --weights native alone means the default model")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if present)")
    p.add_argument("--batch", type=ints, default=None, help="decode batch sizes (default 1,2,4,8,16,32,64)")
    p.add_argument("--step-tokens", type=ints, default=None, help="step sizes (default 1,2,4,...,128)")
    p.add_argument("--step-batch", type=ints, default=None, help="batch sizes of the step-cost curve (default 1,8)")
    p.add_argument("--context", type=int, default=512, help="committed tokens per sequence (default 512)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions on a CPU (default 5)")
    p.add_argument("--copy-mb", type=int, default=None,
                   help="buffer of the copy-bandwidth probe (default 1024 GPU, 256 CPU)")
    p.add_argument("--prefill", type=int, default=0,
                   help="also time the prefill of a prompt of this many tokens, in the causal chunks generate "
                        "uses on the device (default 0: not timed)")
    p.add_argument("--quick", action="store_true", help="few small sizes (smoke test)")
    p.add_argument("--no-tune", action="store_true", help="keep every product plain F.linear (no tuning)")
    p.add_argument("--isa", type=lambda t: [x.strip() for x in t.split(",") if x.strip()], default=None,
                   help="CPU kernel builds to time side by side at every point, e.g. avx2,avx512 (default: the "
                        "active one; kernels/skinny.py, SPECDEC_CPU_ISA)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="time the runner's step replayed from CUDA graphs (the step ms columns; needs a GPU "
                        "and --kernel triton)")
    p.add_argument("--exact", action="store_true",
                   help="the exact path (kernels/backend.py TritonBackend(exact=True)): products and LM head in "
                        "kernels/exact_linear.py, attention with one key order per row (needs the triton kernels)")
    p.add_argument("--extra-weight-memory", choices=("auto", "on", "off"), default="auto",
                   help="may tuning keep a packed second copy of the weights (default auto: models <= 2 GiB)")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR), help="where tuning results are cached")
    p.add_argument("--out", default="out/model_speed",
                   help="folder for model_speed.json/.md and step_cost.png (default out/model_speed)")
    args = p.parse_args(argv)
    gpu = torch.cuda.is_available() and (args.device or "cuda").startswith("cuda")
    if args.weights == "native" and args.model is None:
        args.model = "smollm2"  # native blocks come from a file: the embedded default model's
    if args.model is not None and args.shape is None and args.model == "smollm2":
        args.shape = "smollm2-135m"  # its shape, for the length checks below and the report
    args.shape = args.shape or ("mistral-7b" if gpu else "smollm2-135m")
    if args.cuda_graphs and not (gpu and args.kernel != "torch"):
        p.error("--cuda-graphs needs a CUDA device and the triton kernels (not --kernel torch)")
    if args.exact and (args.kernel or ("triton" if gpu else "torch")) != "triton":
        p.error("--exact runs on the triton kernels: add --kernel triton (on a CPU they run interpreted)")
    if args.exact and args.weights not in (None, "fp32"):
        p.error(f"--exact multiplies unquantized weights: --weights {args.weights} cannot go with it")
    if args.quick:
        args.batch = args.batch or [1, 2]
        args.step_tokens = args.step_tokens or [1, 4, 16]
        args.step_batch = args.step_batch or [1, 2]
        args.context = min(args.context, 64)
        args.reps = min(args.reps, 2)
        args.copy_mb = 16 if args.copy_mb is None else args.copy_mb
    args.batch = args.batch or [1, 2, 4, 8, 16, 32, 64]
    args.step_tokens = args.step_tokens or [1, 2, 4, 8, 16, 32, 64, 128]
    args.step_batch = args.step_batch or [1, 8]
    if args.copy_mb is None:
        args.copy_mb = 1024 if gpu else 256
    if args.isa:
        from kernels import skinny
        if gpu and (args.device or "cuda").startswith("cuda"):
            p.error("--isa chooses CPU kernel builds: add --device cpu")
        bad = [x for x in args.isa if x not in skinny.ISAS]
        if bad:
            p.error(f"--isa: unknown {bad}; choose from {','.join(skinny.ISAS)}")
        missing = [x for x in args.isa if x not in skinny.cpu_isas()]
        if missing:
            p.error(f"--isa: this CPU does not run {missing} (it runs {','.join(skinny.cpu_isas()) or 'neither'})")
    if args.context < 1:
        p.error(f"--context must be >= 1, got {args.context}")
    if args.prefill < 0:
        p.error(f"--prefill must be >= 0 (0: not timed), got {args.prefill}")
    positions = SHAPES[args.shape]["max_position_embeddings"]
    if args.prefill > positions:
        p.error(f"--prefill {args.prefill} is longer than the {args.shape} shape's {positions} positions")
    if args.copy_mb < 1:
        p.error(f"--copy-mb must be >= 1, got {args.copy_mb}")
    if args.reps < 1:
        p.error(f"--reps must be >= 1, got {args.reps}")
    if max(args.step_tokens) > 1024:
        p.error(f"--step-tokens at most 1024 (one step's mask), got {max(args.step_tokens)}")
    if args.context + max(args.step_tokens) > positions:
        p.error(f"--context {args.context} + --step-tokens {max(args.step_tokens)} exceed the {args.shape} shape's "
                f"{positions} positions")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    res = measure(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "model_speed.json").write_text(json.dumps(res, indent=1))
    md = markdown(res)
    (out / "model_speed.md").write_text(md)
    png = chart(res, out / "step_cost.png")
    print(md)
    print(f"wrote {out}/model_speed.json, model_speed.md" + (", step_cost.png" if png else ""))
    return res


if __name__ == "__main__":
    main()
