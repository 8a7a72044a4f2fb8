"""The decoding flags reach the proposer and the sampler they name, from the command line
(`python -m decoding`) and from the benchmark (`bench/run.py`): parsed, then built by the same
functions the two entry points call (decoding.options.build_proposer / sampling_of)."""

import pytest

from decoding.hybrid import Hybrid
from decoding.lookahead import LookaheadPLD
from decoding.options import build_proposer, sampling_of
from decoding.prompt_lookup import PromptLookup

FLAGS = ["--lookahead", "5,4,3", "--pld", "2,6", "--pld-candidates", "2"]


def _parsers():
    import bench.run as bench_run
    from decoding import cli

    return {"cli": lambda extra: cli.parse_args(["a prompt"] + extra),
            "bench": lambda extra: bench_run.parse_args(extra)}


@pytest.mark.parametrize("entry", ["cli", "bench"])
def test_draft_flags_reach_the_proposers(entry):
    args = _parsers()[entry](FLAGS)
    pld = build_proposer("pld", args)
    assert isinstance(pld, PromptLookup)
    assert (pld.cfg.max_ngram, pld.cfg.num_draft, pld.cfg.num_candidates) == (2, 6, 1)  # pld: one candidate
    la = build_proposer("lookahead+pld", args)
    assert isinstance(la, LookaheadPLD)
    assert (la.cfg.window, la.cfg.ngram, la.cfg.guesses) == (5, 4, 3)
    assert (la.cfg.pld.max_ngram, la.cfg.pld.num_draft, la.cfg.pld.num_candidates) == (2, 6, 2)
    hy = build_proposer("hybrid", args)
    assert isinstance(hy, Hybrid)
    assert (hy.cfg.window, hy.cfg.ngram, hy.cfg.guesses) == (5, 4, 3)
    assert (hy.cfg.pld.max_ngram, hy.cfg.pld.num_draft, hy.cfg.pld.num_candidates) == (2, 6, 2)
    # the defaults differ from the flags above: the flags, not the defaults, were read
    default = build_proposer("lookahead+pld", _parsers()[entry]([]))
    assert (default.cfg.window, default.cfg.pld.num_draft, default.cfg.pld.num_candidates) != (5, 6, 2)


@pytest.mark.parametrize("entry", ["cli", "bench"])
def test_sampling_flags_reach_the_sampler(entry):
    parse = _parsers()[entry]
    sp = sampling_of(parse(["--temperature", "0.7", "--top-k", "20", "--top-p", "0.9", "--seed", "5"]))
    assert (sp.temperature, sp.top_k, sp.top_p, sp.seed) == (0.7, 20, 0.9, 5) and not sp.greedy
    greedy = sampling_of(parse(["--seed", "5"]))
    assert greedy.greedy and greedy.seed is None  # a seed means nothing without a temperature


@pytest.mark.parametrize("flag, value", [("--lookahead", "5,4"), ("--pld", "0,6"), ("--pld-candidates", "0"),
                                         ("--top-p", "1.5"), ("--temperature", "-1")])
@pytest.mark.parametrize("entry", ["cli", "bench"])
def test_bad_draft_and_sampling_flags_are_refused_by_name(entry, flag, value, capsys):
    with pytest.raises(SystemExit):
        _parsers()[entry]([flag, value])
    assert flag in capsys.readouterr().err


def test_cli_text_flags_reach_the_generator(monkeypatch):
    """--stop (its escapes decoded), --no-chat-template, --method and the sampling flags reach
    TextGenerator.generate as the CLI calls it (the model stubbed: no load)."""
    from types import SimpleNamespace

    from decoding import cli
    from decoding.text import TextGenerator

    seen = {}

    class Gen:
        chat_template = True
        cache_dir = None
        tokenizer = None
        model = SimpleNamespace(cfg=SimpleNamespace(max_position_embeddings=1000))

        def encode(self, prompt):
            return [1, 2, 3]

        def generate(self, prompt, proposer, **kw):
            seen.update(kw, prompt=prompt, proposer=proposer, chat_template=self.chat_template)
            stats = SimpleNamespace(forwards=1, accepted_hist={1: 1})
            return [SimpleNamespace(token_ids=[5], stats=stats, finish_reason="stop")]

    monkeypatch.setattr(TextGenerator, "load", classmethod(lambda cls, *a, **k: Gen()))
    monkeypatch.setattr(cli, "planner_for", lambda *a, **k: None)
    import io
    assert cli.main(["a prompt", "--stop", r"\n\n", "--stop", "END", "--no-chat-template", "--method", "pld",
                     "--pld", "2,5", "--temperature", "0.5", "--seed", "3", "--max-new-tokens", "9"],
                    out=io.StringIO(), err=io.StringIO()) == 0
    assert seen["stop"] == ["\n\n", "END"] and seen["chat_template"] is False and seen["prompt"] == "a prompt"
    assert seen["proposer"].name == "pld" and seen["proposer"].cfg.num_draft == 5
    assert seen["max_new_tokens"] == 9 and seen["sampling"].temperature == 0.5 and seen["sampling"].seed == 3


def test_bench_tasks_and_split_choose_the_prompts():
    import bench.run as bench_run

    recs = bench_run.load_records(bench_run.parse_args(["--tasks", "code,qa", "--split", "dev", "--limit", "2"]))
    assert {r["task"] for r in recs} == {"code", "qa"} and len(recs) == 4
    from bench.data.suite import load_suite
    dev = {r["id"] for r in load_suite(tasks=["code", "qa"], split="dev")}
    assert {r["id"] for r in recs} <= dev
    test = bench_run.load_records(bench_run.parse_args(["--tasks", "code", "--limit", "1"]))
    assert test[0]["id"] not in dev  # the default split is test


def test_the_draft_model_reaches_the_draft_proposers():
    """What --draft-model loads is the model the draft and draft+pld proposers run (the CLI and
    the bench both pass it to build_proposer); without one, a clear error."""
    from decoding.draft import DraftModel, DraftPLD
    from decoding.cli import parse_args

    args = parse_args(["a prompt", "--pld", "2,6"])  # (--method draft would need --draft-model at parse time)
    draft = object()
    d = build_proposer("draft", args, draft)
    assert isinstance(d, DraftModel) and d.draft is draft
    dp = build_proposer("draft+pld", args, draft)
    assert isinstance(dp, DraftPLD) and dp.draft is draft and (dp.pld.max_ngram, dp.pld.num_draft) == (2, 6)
    with pytest.raises(ValueError, match="needs --draft-model"):
        build_proposer("draft", args, None)
