"""Our drafters inside vLLM (decoding/vllm.py) against vLLM's plain greedy decoding on the
default model: the same tokens, in fewer forwards. Marker ``vllm``: not in the default suite;
``make test-vllm`` builds vLLM's own venv (``make vllm``) and runs these with its python.
Skipped, with the reason, where vLLM cannot be imported. Each engine runs in a child process
(bench/vllm_compare.py), one thread, as the benchmark runs it."""

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM is not installed here: build its venv with `make vllm`, then "
                                   "`make test-vllm`")

NEW_TOKENS = 48
PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Summarize in one sentence: The Amazon rainforest covers much of the Amazon basin of South America. It spans "
    "nine nations and holds the largest variety of species on Earth.",
    # a copy: drafts must be accepted somewhere
    "Repeat this list exactly, one item per line: apples, pears, plums, cherries, apples, pears, plums, cherries.",
]


@pytest.fixture(scope="module")
def prompts():
    from models.loader import load_tokenizer

    tok = load_tokenizer()
    return [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                    return_dict=False) for t in PROMPTS]


def run(method, prompts):
    from bench.vllm_compare import run_method

    return run_method(method, prompts, NEW_TOKENS, 1, model=None, k=10, pld=(3, 10), python=Path(sys.executable),
                      timeout_s=900)["records"]


@pytest.fixture(scope="module")
def plain(prompts):
    return run("vllm", prompts)


@pytest.mark.parametrize("method", ["vllm-specdec", "vllm-specdec-mix", "vllm-specdec-pld", "vllm-specdec-suffix"])
def test_ours_in_vllm_is_vllm_plain_greedy(method, prompts, plain):
    ours = run(method, prompts)
    for i, (a, b) in enumerate(zip(plain, ours)):
        assert b["output_ids"] == a["output_ids"], f"{method}: prompt {i} differs from vLLM plain"
    assert all(a["forwards"] == len(a["output_ids"]) - 1 for a in plain)  # plain: one token per forward
    # drafts were sent and accepted: fewer forwards than plain over the prompts
    assert sum(b["forwards"] for b in ours) < sum(a["forwards"] for a in plain)
