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

from decoding import inputs, interrupt
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
    p.add_argument("--stop", action="append", default=[],
                   help=r"stop when this text appears (repeatable); \n, \t and \\ in it stand for a newline, a tab "
                        r"and a backslash, so --stop '\n\n' stops at a blank line")
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    add_model_flags(p)
    add_decoding_flags(p)
    args = p.parse_args(argv)
    try:
        if (args.prompt is None) == (args.messages is None):
            raise ValueError("give a prompt or --messages FILE (one of them)")
        if args.prompt is not None:
            inputs.prompt(args.prompt, "the prompt")
        if args.messages is not None:
            if args.no_chat_template:
                raise ValueError("--no-chat-template feeds a prompt as raw text; --messages is a chat, which "
                                 "always goes through the chat template: drop one of them")
            args.chat = _read_messages(args.messages)
        inputs.at_least(args.max_new_tokens, "--max-new-tokens", 1)
        args.stop = inputs.stop_strings([inputs.unescape(s) for s in args.stop], "--stop")
        if args.method == "ar" and (args.step_cost is not None or args.fixed_plan):
            raise ValueError("--step-cost and --fixed-plan size the planner's steps; --method ar sends one token "
                             "per step and plans nothing")
        check(args, [args.method])
    except ValueError as e:
        p.error(str(e))
    return args


def _read_messages(path: Path) -> list[dict]:
    inputs.input_file(path, "--messages")
    try:
        msgs = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"--messages {path}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--messages {path}: not JSON ({e})") from None
    try:
        return inputs.messages(msgs)
    except ValueError as e:
        raise ValueError(f"--messages {path}: {e} (expected a JSON list of {{\"role\": system|user|assistant, "
                         f"\"content\": text}})") from None


def main(argv=None, out=sys.stdout, err=sys.stderr) -> int:
    args = parse_args(argv)
    from decoding.text import TextGenerator
    from kernels.backend import get_backend
    from models.loader import load_model

    backend = get_backend(args.kernel, args.device, exact=args.exact)
    gen = TextGenerator.load(args.model, backend=backend, dtype=DTYPES[args.dtype], device=args.device,
                             weights=args.weights, named_by="--model")
    gen.chat_template = not args.no_chat_template
    prompt = args.chat if args.messages is not None else args.prompt
    n, ctx = len(gen.encode(prompt)), gen.model.cfg.max_position_embeddings
    if n + args.max_new_tokens > ctx:  # before the draft model loads and the step cost is measured
        raise ValueError(f"--max-new-tokens {args.max_new_tokens}: the prompt has {n} tokens and the model's context "
                         f"is {ctx}, so at most {max(ctx - n, 0)} new tokens fit")
    draft = None
    if args.draft_model:
        loaded = load_model(args.draft_model, backend, DTYPES[args.dtype], args.device, weights=args.weights,
                            named_by="--draft-model")
        inputs.same_tokenizer(gen.tokenizer, loaded.tokenizer, f"--model {args.model}",
                              f"--draft-model {args.draft_model}")
        draft = loaded.model
    if args.cuda_graphs:
        from models.graphs import use_cuda_graphs
        for m in (gen.model, draft):
            if m is not None:
                use_cuda_graphs(m)
    proposer = build_proposer(args.method, args, draft)

    streamed = []

    def stream(_, piece):
        out.write(piece)
        out.flush()
        streamed.append(len(piece))

    from models.kv_cache import KVCacheFull
    from models.loader import DEFAULT_CACHE_DIR
    planner = planner_for(gen.model, proposer.name, args.no_plan, gen.cache_dir or DEFAULT_CACHE_DIR,
                          args.step_cost_curve, args.fixed_plan)
    t0 = time.perf_counter()
    try:
        r = gen.generate(prompt, proposer, max_new_tokens=args.max_new_tokens, sampling=sampling_of(args),
                         stop=args.stop, stream=stream, plan=planner is not None, planner=planner)[0]
    except KVCacheFull as e:  # in the user's terms: the flags that size a step
        raise ValueError(inputs.cache_full(e)) from None
    except KeyboardInterrupt as e:  # Ctrl-C: the text streamed stays; the stats of what was generated
        name, code = interrupt.name_and_code(e)
        with interrupt.held():
            if streamed:
                out.write("\n")
            part = getattr(e, "partial", None)
            if part and part[0].output_ids:
                _stats(err, args.method, part[0].output_ids, part[0].stats, time.perf_counter() - t0,
                       f"interrupted ({name})")
            else:
                err.write(f"[{args.method}] interrupted ({name}) before the first token\n")
        return code
    out.write("\n")
    _stats(err, args.method, r.token_ids, r.stats, time.perf_counter() - t0, r.finish_reason)
    return 0


def _stats(err, method: str, ids: list[int], st, secs: float, finish: str) -> None:
    """The lines after an answer: rate, tau, why it ended, tokens gained per step."""
    n = len(ids)
    hist = ", ".join(f"{k}: {v}" for k, v in sorted(st.accepted_hist.items()))
    err.write(f"[{method}] {n} tokens in {secs:.2f} s ({n / secs:.1f} tokens/s, prefill included); "
              f"tau {(n - 1) / max(st.forwards, 1):.2f} tokens per forward; finish: {finish}\n"
              f"tokens gained per step -> steps: {hist or '-'}\n")


def entry() -> None:
    try:
        with interrupt.raising():  # SIGTERM too: the same exit as Ctrl-C (decoding/interrupt.py)
            sys.exit(main())
    except ValueError as e:  # bad input found after parsing (model path, GGUF file, ...)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:  # before generation began (loading the model, measuring the step cost)
        name, code = interrupt.name_and_code(e)
        print(f"interrupted ({name}) before generating: nothing was streamed", file=sys.stderr)
        sys.exit(code)
