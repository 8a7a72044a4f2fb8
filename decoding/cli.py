"""``python -m decoding``: a prompt in, the answer streamed out as it is accepted, then
tokens/s, tau and the histogram of tokens gained per step.

    python -m decoding "Write a haiku about caches." --method lookahead+pld
    python -m decoding --messages chat.json --method hybrid --temperature 0.7 --seed 1
    python -m decoding "def fib(n):" --no-chat-template --method pld --max-new-tokens 64
"""

import argparse
import json
import sys
import time
from pathlib import Path

from decoding.methods import METHODS
from decoding.options import (DTYPES, add_decoding_flags, add_model_flags, build_proposer, check, planner_for,
                              sampling_of)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m decoding", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", nargs="?", default=None, help="the prompt (a user message unless --no-chat-template)")
    p.add_argument("--messages", type=Path, default=None,
                   help='a JSON file of chat messages [{"role": "user", "content": "..."}, ...] instead of a prompt')
    p.add_argument("--method", default="lookahead+pld", choices=METHODS, help="decoding method (default lookahead+pld)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="most tokens to generate (default 256)")
    p.add_argument("--stop", action="append", default=[], help="stop when this text appears (repeatable)")
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    add_model_flags(p)
    add_decoding_flags(p)
    args = p.parse_args(argv)
    try:
        if (args.prompt is None) == (args.messages is None):
            raise ValueError("give a prompt or --messages FILE (one of them)")
        if args.messages is not None:
            args.chat = _read_messages(args.messages)
        if args.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
        if args.method.startswith("draft") and not args.draft_model:
            raise ValueError(f"--method {args.method} needs --draft-model (a smaller model with the same tokenizer)")
        check(args)
    except ValueError as e:
        p.error(str(e))
    return args


def _read_messages(path: Path) -> list[dict]:
    if not path.is_file():
        raise ValueError(f"--messages {path}: no such file")
    try:
        msgs = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--messages {path}: not JSON ({e})") from None
    ok = isinstance(msgs, list) and msgs and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                 and m.get("role") in ("system", "user", "assistant") for m in msgs)
    if not ok:
        raise ValueError(f"--messages {path}: expected a non-empty list of {{'role': system|user|assistant, "
                         f"'content': text}}")
    return msgs


def main(argv=None, out=sys.stdout, err=sys.stderr) -> int:
    args = parse_args(argv)
    from decoding.text import TextGenerator
    from kernels.backend import get_backend
    from models.loader import load_model

    backend = get_backend(args.kernel, args.device)
    gen = TextGenerator.load(args.model, backend=backend, dtype=DTYPES[args.dtype], device=args.device)
    gen.chat_template = not args.no_chat_template
    draft = load_model(args.draft_model, backend, DTYPES[args.dtype], args.device)[0] if args.draft_model else None
    if args.cuda_graphs:
        from models.graphs import use_cuda_graphs
        for m in (gen.model, draft):
            if m is not None:
                use_cuda_graphs(m)
    prompt = args.chat if args.messages is not None else args.prompt
    proposer = build_proposer(args.method, args, draft)

    def stream(_, piece):
        out.write(piece)
        out.flush()

    from models.loader import DEFAULT_CACHE_DIR
    planner = planner_for(gen.model, proposer.name, args.no_plan, gen.cache_dir or DEFAULT_CACHE_DIR,
                          args.step_cost_curve, args.fixed_plan)
    t0 = time.perf_counter()
    r = gen.generate(prompt, proposer, max_new_tokens=args.max_new_tokens, sampling=sampling_of(args),
                     stop=args.stop, stream=stream, plan=planner is not None, planner=planner)[0]
    secs = time.perf_counter() - t0
    out.write("\n")
    st, n = r.stats, len(r.token_ids)
    hist = ", ".join(f"{k}: {v}" for k, v in sorted(st.accepted_hist.items()))
    err.write(f"[{args.method}] {n} tokens in {secs:.2f} s ({n / secs:.1f} tokens/s, prefill included); "
              f"tau {(n - 1) / max(st.forwards, 1):.2f} tokens per forward; finish: {r.finish_reason}\n"
              f"tokens gained per step -> steps: {hist or '-'}\n")
    return 0


def entry() -> None:
    try:
        sys.exit(main())
    except ValueError as e:  # bad input found after parsing (model path, GGUF file, ...)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
