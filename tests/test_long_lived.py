"""One TextGenerator serving many requests, as a server would: mixed methods (long-lived
proposers, one suffix store shared by suffix and hybrid, recycling's shared table), prompt and
answer lengths, greedy and seeded sampling (temperature, top-k, top-p), stop strings, EOS and
max-token ends, single prompts and pairs, all through ONE generator, ONE model runner (its KV
cache shared by every request) and the same proposers. After every request each KV block is
back in the pool; greedy answers equal those of a fresh generator (a fresh TextGenerator, a
new runner and plain autoregressive decoding, in this process: a fresh process per request
would cost a model and tokenizer load each, ~6 s); seeded autoregressive sampling equals a
fresh run too. The slow test serves 500 requests and checks that resident memory after 100 of
them grows by at most 5% by the end; the default one serves 50.

The model is a tiny random Llama with the default model's tokenizer (its vocabulary). Prompts
come from a small pool, so that requests repeat one another and the suffix store's drafts get
accepted. Its EOS never comes by chance, so EOS ends come from ``eos_token_ids``: a token of
the fresh answer."""

import gc
import os
import random
from pathlib import Path

import pytest
import torch

from decoding import SamplingParams, TextGenerator
from decoding.methods import make_proposer
from decoding.recycle import RecycleConfig
from decoding.suffix import SuffixConfig, SuffixStore
from helpers import ours_from_hf, tiny_hf_model

METHODS = ("ar", "pld", "suffix", "lookahead+pld", "hybrid", "recycle")
WORDS = ("the cat sat on a mat while rain fell over old stone roofs and the river ran past quiet "
         "gardens where children played games of chance with painted wooden blocks").split()


@pytest.fixture(scope="module")
def served():
    from models.loader import load_tokenizer

    tok = load_tokenizer()
    hf = tiny_hf_model("llama", seed=1, vocab_size=len(tok), max_position_embeddings=512)
    runner = ours_from_hf(hf, cache_tokens=2048, block_size=4)
    # one thread: a tiny model gains nothing from two, and threads that wait spinning for a core
    # another process holds made the same requests take ten times as long on a shared machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield runner, tok
    finally:
        torch.set_num_threads(threads)


def _requests(n: int, seed: int, longest: int) -> list[dict]:
    rnd = random.Random(seed)
    pool = [" ".join(rnd.choice(WORDS) for _ in range(k)) for k in (1, 2, 3, 5, 8, 12, 20, 30, 40, 60, 80, 100)]
    out = []
    for i in range(n):
        greedy = rnd.random() < 0.6
        sampling = None if greedy and rnd.random() < 0.5 else SamplingParams() if greedy else SamplingParams(
            temperature=rnd.choice([0.5, 0.8, 1.0, 1.3]), seed=rnd.randrange(1 << 20),
            top_k=rnd.choice([0, 0, 5, 50]), top_p=rnd.choice([1.0, 1.0, 0.9, 0.5]))
        prompts = [rnd.choice(pool) for _ in range(2 if rnd.random() < 0.15 else 1)]
        end = rnd.choice(["length", "eos", "stop"]) if greedy else "length"
        out.append(dict(index=i, method=METHODS[i % len(METHODS)], prompts=prompts, greedy=greedy,
                        sampling=sampling, max_new_tokens=rnd.randint(1, longest), end=end,
                        by_name=rnd.random() < 0.3, pick=rnd.random()))
    return out


def _fresh(gen: TextGenerator, prompts: list[str], max_new_tokens: int, sampling) -> list[list[int]]:
    """The answers of a fresh TextGenerator (plain decoding, a runner of its own)."""
    fresh = TextGenerator(gen.model, gen.tokenizer)
    return [r.token_ids for r in fresh.generate(prompts, "ar", max_new_tokens=max_new_tokens, sampling=sampling,
                                                plan=False)]


def _expect(gen: TextGenerator, req: dict, greedy_answers: dict, longest: int) -> None:
    """The fresh answers and, for a greedy request, the EOS token or stop string that ends it
    early: req gains "eos", "stop" and "expected". A greedy answer is the first
    ``max_new_tokens`` of the prompt's fresh answer of ``longest`` tokens (made once per prompt:
    alone, as greedy answers do not depend on the batch); seeded sampling is run fresh as asked."""
    eos = tuple(gen.model.cfg.eos_token_ids)
    req["eos"], req["stop"] = None, ["never in this text: \u2603"]
    if not (req["greedy"] or req["method"] == "ar"):  # sampled by a drafting method: no fresh answer to compare
        return
    if req["greedy"]:
        for p in req["prompts"]:
            if p not in greedy_answers:
                greedy_answers[p] = _fresh(gen, [p], longest, None)[0]
        answers = [greedy_answers[p][:req["max_new_tokens"]] for p in req["prompts"]]
    else:
        answers = _fresh(gen, req["prompts"], req["max_new_tokens"], req["sampling"])
    if req["greedy"] and req["end"] == "eos":
        # the first sequence ends at a token of its fresh answer made the EOS
        toks = answers[0]
        eos = req["eos"] = (toks[int(req["pick"] * len(toks))],)
    if req["greedy"] and req["end"] == "stop":
        toks = answers[0]
        before_last = gen.tokenizer.decode(toks[:-1], skip_special_tokens=True)  # a stop hit before the last token
        words = [w for w in before_last.split() if w]
        if words:
            req["stop"].append(words[int(req["pick"] * len(words))][:3])
    expected = []
    for ids in answers:
        hit = [k for k, t in enumerate(ids) if t in eos]
        if hit:
            ids = ids[:hit[0] + 1]
        text = gen.tokenizer.decode([t for t in ids if t not in eos], skip_special_tokens=True)
        cuts = [text.find(s) for s in req["stop"] if s in text]
        finish = "eos" if hit else "length"
        if cuts:
            text, finish = text[:min(cuts)], "stop"
        expected.append((ids, text, finish))
    req["expected"] = expected


def _rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def serve(runner, tok, n: int, seed: int, longest: int, warm_up: int | None = None) -> dict:
    gen = TextGenerator(runner.model, tok)
    requests, greedy_answers = _requests(n, seed, longest), {}
    for req in requests:  # first, the fresh answers (every greedy or seeded-"ar" request)
        _expect(gen, req, greedy_answers, longest)
    gc.collect()

    sc = SuffixConfig()
    store = SuffixStore(sc.depth, sc.store_nodes)  # suffix and hybrid's requests draft from each other's answers
    proposers = {m: make_proposer(m, store=store if m in ("suffix", "hybrid") else None,
                                  config=RecycleConfig(shared=True) if m == "recycle" else None) for m in METHODS}
    blocks = sorted(runner.cache.free_blocks)
    finishes, accepted, rss = {}, 0, {}
    for req in requests:
        method = req["method"] if req["by_name"] and req["method"] not in ("suffix", "hybrid") \
            else proposers[req["method"]]
        kw = {} if req["eos"] is None else {"eos_token_ids": req["eos"]}
        res = gen.generate(req["prompts"], method, max_new_tokens=req["max_new_tokens"], sampling=req["sampling"],
                           stop=req["stop"], plan=False, runner=runner, **kw)
        where = f"request {req['index']} ({req['method']}, {len(req['prompts'])} prompts, " \
                f"max_new_tokens {req['max_new_tokens']}, {req['sampling']}, end {req['end']})"
        # every block back in the pool, none twice
        assert sorted(runner.cache.free_blocks) == blocks and not runner.seq_ids, where
        for k, r in enumerate(res):
            finishes[r.finish_reason] = finishes.get(r.finish_reason, 0) + 1
            accepted += sum(r.stats.accepted.values())
            assert 1 <= len(r.token_ids) <= req["max_new_tokens"], where
            assert r.finish_reason in ("eos", "stop", "length"), where
            if len(r.token_ids) < req["max_new_tokens"]:
                assert r.finish_reason != "length", where
            assert not any(s in r.text for s in req["stop"]), where
            if "expected" in req:
                ids, text, finish = req["expected"][k]
                assert (r.finish_reason, r.text) == (finish, text), where
                if finish != "stop":  # a stop string ends a sequence where its text shows, tokens may differ
                    assert r.token_ids == ids, where
                else:
                    assert r.token_ids == ids[:len(r.token_ids)], where
        if warm_up is not None and req["index"] + 1 in (warm_up, n):
            gc.collect()
            rss[req["index"] + 1] = _rss_bytes()
    return dict(finishes=finishes, accepted=accepted, rss=rss, store=store)


def _check(out: dict) -> None:
    assert {"eos", "stop", "length"} <= set(out["finishes"]), out["finishes"]
    assert out["accepted"] > 0  # the drafts were accepted: the cache's commits of accepted paths ran


def test_one_generator_serves_fifty_mixed_requests(served):
    runner, tok = served
    _check(serve(runner, tok, 50, seed=0, longest=32))


@pytest.mark.slow
def test_one_generator_serves_five_hundred_requests_without_growing(served):
    runner, tok = served
    out = serve(runner, tok, 500, seed=1, longest=64, warm_up=100)
    _check(out)
    before, after = out["rss"][100], out["rss"][500]
    assert after <= before * 1.05, f"resident memory grew from {before / 2**20:.1f} MiB after 100 requests to " \
                                   f"{after / 2**20:.1f} MiB after 500"


def test_a_stop_string_in_the_step_that_reaches_the_length_ends_with_stop(served):
    """A draft step can bring the stop string and the last allowed token at once (here: the
    suffix store holds the whole answer, one step accepts it): the answer ends with "stop" and
    the text before it, as plain decoding's does (it was "length", with the text cut)."""
    runner, tok = served
    gen = TextGenerator(runner.model, tok)
    prompt, n = "the cat sat on a mat", 12
    full = gen.generate(prompt, "ar", max_new_tokens=n, plan=False)[0].text
    words = full.split()
    stop = words[len(words) // 2]
    plain = gen.generate(prompt, "ar", max_new_tokens=n, stop=stop, plan=False)[0]
    sc = SuffixConfig()
    suffix = make_proposer("suffix", store=SuffixStore(sc.depth, sc.store_nodes))
    gen.generate(prompt, suffix, max_new_tokens=n, plan=False)  # the answer goes into the store
    r = gen.generate(prompt, suffix, max_new_tokens=n, stop=stop, plan=False, runner=runner)[0]
    assert len(r.token_ids) == n  # the step that brought the stop string reached the length too
    assert (r.finish_reason, r.text) == (plain.finish_reason, plain.text) == ("stop", full[:full.find(stop)])
