"""The real draft pair: Qwen2.5-Coder 0.5B drafting for 1.5B (fetched with
``python -m models.fetch``). Behind the ``slow`` marker and skipped when the models are not
fetched: CI never downloads them."""

import pytest

from decoding import generate, make_proposer
from models.fetch import model_path

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (model_path("qwen2.5-coder-0.5b").is_file() and model_path("qwen2.5-coder-1.5b").is_file()),
    reason="run `python -m models.fetch qwen2.5-coder-0.5b qwen2.5-coder-1.5b` first")]

QUESTIONS = ["Write a Python function that checks whether a string is a palindrome.",
             "Fix the bug: def add(a, b):\n    return a - b"]


@pytest.fixture(scope="module")
def pair():
    from models.loader import load_model

    target, tok = load_model("qwen2.5-coder-1.5b")
    draft, dtok = load_model("qwen2.5-coder-0.5b")
    assert dtok.get_vocab() == tok.get_vocab()  # one tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                       tokenize=True, return_dict=False) for q in QUESTIONS]
    return target, draft, prompts


@pytest.mark.parametrize("method", ["draft", "draft+pld", "pld", "lookahead+pld"])
def test_real_pair_greedy_identical_to_ar(pair, method):
    target, draft, prompts = pair
    ref = [r.output_ids for r in generate(target, prompts, max_new_tokens=24)]
    proposer = make_proposer(method, draft_model=draft) if method.startswith("draft") else make_proposer(method)
    out = generate(target, prompts, proposer, max_new_tokens=24)
    assert [r.output_ids for r in out] == ref
    if method.startswith("draft"):  # the 0.5B model agrees with the 1.5B often on code: tau well above 1
        assert sum(len(r.output_ids) - 1 for r in out) / sum(r.stats.forwards for r in out) > 1.3
