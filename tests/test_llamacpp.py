"""llama.cpp's llama-server on the default model (bench/llamacpp_compare.py, as
``bench/run.py --compare-llamacpp`` runs it): what it answers on our token ids, and its n-gram
speculation against its own plain decoding. Marker ``llamacpp``: not in the default suite;
``make test-llamacpp`` builds llama.cpp first (``make llamacpp``). Skipped, with the reason,
where the build is missing. The fake-server tests of the same code: tests/test_llamacpp_compare.py."""

import pytest

from bench import llamacpp_compare as lc

pytestmark = pytest.mark.llamacpp

try:
    SERVER = lc.binary("llama-server")
except ValueError as e:
    pytest.skip(str(e), allow_module_level=True)

NEW_TOKENS = 48
PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    # a copy: drafts must be accepted somewhere
    "Repeat this list exactly, one item per line: apples, pears, plums, cherries, apples, pears, plums, cherries.",
]


@pytest.fixture(scope="module")
def prompts():
    from models.loader import load_tokenizer

    tok = load_tokenizer()
    return [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                    return_dict=False) for t in PROMPTS]


@pytest.fixture(scope="module")
def model():
    from models.loader import default_model_path

    return default_model_path()


def run(flags, prompts, model):
    return lc.run_method(flags, prompts, NEW_TOKENS, 2, model=model, exe=SERVER)


@pytest.fixture(scope="module")
def plain(prompts, model):
    return run((), prompts, model)


@pytest.fixture(scope="module")
def offered():
    import subprocess

    return lc.methods(lc.spec_types_offered(subprocess.run([str(SERVER), "--help"], capture_output=True, text=True,
                                                           timeout=60).stdout), (3, 10))


def test_plain_answers_our_token_ids_with_its_timings(prompts, plain):
    assert plain["load"]["s"] > 0 and plain["load"]["peak_mem_mib"] > 0
    for p, g in zip(prompts, plain["responses"]):
        t = g["timings"]
        assert t["prompt_n"] == len(p)  # every prompt token prefilled: no prompt cache, no BOS added
        assert 0 < t["predicted_n"] == len(g["tokens"]) <= NEW_TOKENS
        assert t["prompt_ms"] > 0 and t["predicted_ms"] > 0 and "draft_n" not in t
        assert g["stop_type"] in ("eos", "limit")
        r = lc.record({"id": "x", "conversation": "x", "question_id": "x", "turn": 1, "task": "t",
                       "output_ids": g["tokens"]}, p, [g], "llamacpp", None)
        assert r["forwards"] == len(g["tokens"]) - 1 and r["decode_tok_s"] > 0


@pytest.mark.parametrize("method", ["llamacpp-ngram-simple", "llamacpp-ngram-simple-n3k10", "llamacpp-ngram-map-k",
                                    "llamacpp-ngram-map-k-n3k10", "llamacpp-ngram-mod"])
def test_ngram_speculation_against_its_own_plain(method, prompts, model, plain, offered):
    """Greedy speculation gives llama.cpp plain's tokens (a verification batch could round
    differently from one-token steps: one prompt of three may differ); ngram-simple with our pld's
    lookup and draft lengths has drafts accepted on the copy prompt (ngram-map-k drafts only an
    m-gram seen after its key more than once; llama.cpp's default 12-token lookups rarely match in
    48 tokens)."""
    if method not in offered:
        pytest.skip(f"this llama-server has no --spec-type for {method}")
    got = run(offered[method], prompts, model)
    same = [a["tokens"] == b["tokens"] for a, b in zip(plain["responses"], got["responses"])]
    assert sum(same) >= len(same) - 1, same
    if method == "llamacpp-ngram-simple-n3k10":
        copy = got["responses"][-1]["timings"]
        assert copy.get("draft_n_accepted", 0) > 0, copy
