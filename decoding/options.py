"""Command-line knobs shared by ``python -m decoding`` and ``bench/run.py``: flags, their
checks (each bad value is a clear error naming the flag and its limit, raised before any
model loads) and the method configurations they build."""

import argparse
import re
from pathlib import Path
from typing import Optional

import torch

from decoding import inputs
from decoding.methods import METHODS, check_store, make_proposer
from decoding.sampling import SamplingParams

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def add_model_flags(p: argparse.ArgumentParser) -> None:
    gpu = torch.cuda.is_available()
    p.add_argument("--model", default="smollm2",
                   help="'smollm2' (the embedded default), a fetched name ('qwen2.5-coder-0.5b', "
                        "'qwen2.5-coder-1.5b': python -m models.fetch NAME), a .gguf file or an HF folder")
    p.add_argument("--draft-model", default=None,
                   help="draft model for the 'draft' and 'draft+pld' methods (and transformers' assisted generation "
                        "in the benchmark): a smaller model with the same tokenizer")
    p.add_argument("--kernel", choices=("triton", "torch"), default=None,
                   help="kernel backend (default: triton on a GPU, torch on a CPU)")
    p.add_argument("--device", default="cuda" if gpu else "cpu", help="cpu, cuda or cuda:N (default: cuda if present)")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default: float32 on CPU, bfloat16 on GPU")
    p.add_argument("--weights", default=None, choices=("fp32", "q8_0", "native"),
                   help="the products' weights: fp32, q8_0 (every product weight quantized to Q8_0) or native (a "
                        "GGUF file's own Q4_1 / Q8_0 blocks, Q8_0 for the rest); the quantized forms need an x86 CPU "
                        "in float32 (default: native for a GGUF file on such a CPU, else fp32; fp32 compares with "
                        "transformers number for number)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="replay decoding steps from CUDA graphs (needs --device cuda and --kernel triton; "
                        "models/graphs.py)")
    p.add_argument("--exact", action="store_true",
                   help="the exact path: every product, the LM head and attention in Triton kernels that compute a "
                        "row the same way whatever the step holds, so a verification step's logits are plain "
                        "decoding's bit for bit and greedy drafts give ar's tokens in bf16 too (needs --kernel triton "
                        "and fp32 --weights; kernels/exact_linear.py)")


def add_decoding_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples exactly")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (1 = off)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (each sequence draws from seed and its index)")
    p.add_argument("--lookahead", default="7,5,7", help="W,N,G of lookahead decoding: window, n-gram size, guesses")
    p.add_argument("--pld", default="3,10", help="prompt lookup: longest n-gram matched, draft length")
    p.add_argument("--pld-candidates", type=int, default=4,
                   help="distinct prompt-lookup continuations merged into lookahead+pld's trie (default 4)")
    p.add_argument("--no-plan", action="store_true",
                   help="send every proposer's whole tree (no step planning from the measured step cost)")
    p.add_argument("--step-cost", type=Path, default=None, metavar="FILE",
                   help="plan with the step-cost curve saved in FILE (a benchmark's OUT/step_cost.json) "
                        "instead of this machine's measured one")
    p.add_argument("--fixed-plan", action="store_true",
                   help="plan from the step-cost curve alone, without learning the host's time per step "
                        "from the wall clock: with --step-cost, every step's plan (and tau) is reproducible")


def ints(text: str, flag: str, n: int, minimum: list[int]) -> tuple[int, ...]:
    """``"7,5,7"`` -> (7, 5, 7), or a ValueError naming ``flag``, the count and the limits."""
    try:
        vals = tuple(int(x) for x in text.split(","))
    except ValueError:
        vals = ()
    if len(vals) != n:
        raise ValueError(f"{flag} takes {n} comma-separated integers, got {text!r}")
    for v, lo in zip(vals, minimum):
        if v < lo:
            raise ValueError(f"{flag} {text!r}: each value must be >= {', '.join(map(str, minimum))} in order")
    return vals


DRAFT_METHODS = ("draft", "draft+pld")
WINDOW_METHODS = ("lookahead", "lookahead+pld", "hybrid")


def check(args: argparse.Namespace, methods: list[str], draft_elsewhere: bool = False) -> None:
    """Validate the flags of ``add_model_flags`` / ``add_decoding_flags`` for a run of
    ``methods`` (ValueError naming the flag, before any model loads; the checks and messages
    are decoding/inputs.py's, shared with the Python API), and fill the defaults that depend
    on the device. ``draft_elsewhere``: --draft-model has a use besides the draft methods
    (the benchmark's hf-assisted)."""
    dev = str(args.device)
    if not re.fullmatch(r"cpu|cuda(:\d+)?", dev):
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {dev!r}")
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {dev}: no CUDA device is available here (use --device cpu)")
    if dev.startswith("cuda:") and int(dev[5:]) >= torch.cuda.device_count():
        raise ValueError(f"--device {dev}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                         f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    gpu = dev.startswith("cuda")
    args.kernel = args.kernel or ("triton" if gpu else "torch")
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    if getattr(args, "weights", None) not in (None, "fp32"):
        from models.loader import resolve_weights
        try:
            resolve_weights(args.weights, DTYPES[args.dtype], torch.device(dev))
        except ValueError as e:
            raise ValueError(f"--weights {args.weights}: {e}") from None
    if getattr(args, "exact", False):
        if args.kernel != "triton":
            raise ValueError(f"--exact runs on the Triton kernels: add --kernel triton (got --kernel {args.kernel}"
                             + ("; on a CPU they run interpreted, slowly" if not gpu else "") + ")")
        if getattr(args, "weights", None) not in (None, "fp32"):
            raise ValueError(f"--exact multiplies unquantized weights: --weights {args.weights} cannot go with it "
                             "(use --weights fp32 or drop it)")
    if getattr(args, "cuda_graphs", False) and not (gpu and args.kernel == "triton"):
        raise ValueError(f"--cuda-graphs needs --device cuda and --kernel triton, got --device {dev} "
                         f"--kernel {args.kernel}")
    inputs.sampling(args.temperature, args.top_k, args.top_p, args.seed, names=inputs.flag)
    args.lookahead_wng = ints(args.lookahead, "--lookahead", 3, [2, 2, 0])
    args.pld_nk = ints(args.pld, "--pld", 2, [1, 1])
    W, N, _ = args.lookahead_wng
    for m in [m for m in WINDOW_METHODS if m in methods][-1:]:  # hybrid's limit is the tighter one
        from decoding.hybrid import HybridConfig
        from decoding.lookahead import LookaheadConfig
        cap, what = ((HybridConfig().max_nodes, "hybrid's candidate nodes") if m == "hybrid" else
                     (LookaheadConfig().max_verify, f"{m}'s max_verify"))
        inputs.lookahead_window(W, N, cap, f"--lookahead {args.lookahead}", what)
    inputs.at_least(args.pld_candidates, "--pld-candidates", 1)
    if args.no_plan and (args.step_cost is not None or args.fixed_plan):
        raise ValueError("--step-cost and --fixed-plan size the planner's steps; they cannot go with --no-plan")
    drafting = [m for m in methods if m in DRAFT_METHODS]
    if drafting and not args.draft_model:
        raise ValueError(f"--method{'s' if len(methods) > 1 else ''} {drafting[0]} needs --draft-model "
                         f"(a smaller model with the same tokenizer)")
    if args.draft_model and not drafting and not draft_elsewhere:
        raise ValueError(f"--draft-model {args.draft_model}: only the methods {' and '.join(DRAFT_METHODS)} use a "
                         f"draft model, and {','.join(methods)} does not: drop --draft-model or pick one of them")
    inputs.model_path(args.model, "--model")  # a missing model is named now, not after a load
    if args.draft_model:
        inputs.model_path(args.draft_model, "--draft-model")
    args.step_cost_curve = None
    if args.step_cost is not None:
        from models.cost import load_step_cost
        inputs.input_file(args.step_cost, "--step-cost")
        try:
            args.step_cost_curve = load_step_cost(args.step_cost)
        except ValueError as e:
            raise ValueError(f"--step-cost: {e}") from None


def sampling_of(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          seed=args.seed if args.temperature > 0 else None)


def build_proposer(name: str, args: argparse.Namespace, draft_model=None, store=None):
    """The proposer for ``name`` with the flags' knobs (after ``check``); ``store``: the
    suffix store suffix and hybrid draft from and add to (``make_proposer``)."""
    from decoding.hybrid import HybridConfig
    from decoding.lookahead import LookaheadConfig
    from decoding.prompt_lookup import PromptLookupConfig

    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    if name.startswith("draft") and draft_model is None:
        raise ValueError(f"--method {name} needs --draft-model (a smaller model with the same tokenizer)")
    max_n, k = args.pld_nk
    W, N, G = args.lookahead_wng
    if name == "pld":  # fixed draft length, one candidate: the reference's (and transformers') rule
        return make_proposer(name, config=PromptLookupConfig(max_ngram=max_n, num_draft=k), store=store)
    if name in ("lookahead", "lookahead+pld", "hybrid"):
        pld = PromptLookupConfig(max_ngram=max_n, num_draft=k, num_candidates=args.pld_candidates)
        la = LookaheadConfig(window=W, ngram=N, guesses=G, pld=pld)
        return make_proposer(name, config=HybridConfig(lookahead=la) if name == "hybrid" else la, store=store)
    if name == "draft":
        return make_proposer(name, draft_model=draft_model, store=store)
    if name == "draft+pld":
        check_store(name, store)
        from decoding.draft import DraftPLD
        return DraftPLD(draft_model, pld=PromptLookupConfig(max_ngram=max_n, num_draft=k,
                                                              num_candidates=args.pld_candidates))
    return make_proposer(name, store=store)


def planner_for(model, name: str, no_plan: bool, cache_dir, cost=None, fixed: bool = False,
                recheck_s: float = 0.0) -> Optional[object]:
    """A step planner from ``cost`` (a StepCost, e.g. ``--step-cost``'s) or else the model's
    measured (cached) step cost (``models.cost.step_cost``, with its ``recheck_s``); None for
    ``ar`` or with --no-plan. ``fixed``: do not learn the host's time per step from the wall
    clock (--fixed-plan)."""
    if no_plan or name == "ar":
        return None
    from decoding.planner import Planner, PlannerConfig
    from models.cost import step_cost
    from models.graphs import StepGraphs

    graphs = getattr(model, "step_graphs", None)  # a step past the largest graph's rows runs eagerly
    cap = graphs.get("max_tokens", StepGraphs.DEFAULT_MAX_TOKENS) if graphs is not None else None
    return Planner(cost if cost is not None else step_cost(model, cache_dir, recheck_s=recheck_s),
                   PlannerConfig(learn_overhead=not fixed, max_step_tokens=cap))
