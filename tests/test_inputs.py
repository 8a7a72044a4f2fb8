"""Bad inputs, tried as a new user would, at the three front doors (``python -m decoding``,
``bench/run.py``, ``TextGenerator.generate``): each is a clear error naming the flag or
argument, what it got and what it accepts, raised before a model loads (or, for what only a
loaded model can tell, before anything is measured or generated). The checks live in
decoding/inputs.py; the tests check the message as well as the failure. No test here loads a
real model: a tiny random one and a character tokenizer stand in where one is needed."""

import json
import os
import sys
from pathlib import Path

import pytest

from decoding import HybridConfig, LookaheadConfig, SamplingParams, TextGenerator, inputs
from decoding.cli import main as cli_main
from decoding.cli import parse_args as cli_args
from helpers import ours_from_hf, tiny_hf_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench.run as a module
from bench.run import load_records  # noqa: E402
from bench.run import parse_args as bench_args  # noqa: E402


class CharTokenizer:
    """Characters as tokens (ids 1..26 for a..z, 27 for a space), decoded over an 8-letter
    alphabet so that a tiny random model's text repeats letters; a chat is its messages'
    contents. ``swap`` gives two letters each other's id: a tokenizer of the same size that is
    not the same tokenizer."""

    ALPHABET = "abcdefghijklmnopqrstuvwxyz "

    def __init__(self, swap: bool = False, chat_template: str | None = "{{ messages }}"):
        self.vocab = {c: i + 1 for i, c in enumerate(self.ALPHABET)}
        if swap:
            self.vocab["a"], self.vocab["b"] = self.vocab["b"], self.vocab["a"]
        self.chat_template = chat_template

    def get_vocab(self):
        return dict(self.vocab)

    def encode(self, text, add_special_tokens=True):
        return [self.vocab.get(c, 27) for c in text.lower()]

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, return_dict=False):
        return self.encode(" ".join(m["content"] for m in messages))

    def decode(self, ids, skip_special_tokens=True):
        return "".join("abcdefgh"[i % 8] for i in ids)


@pytest.fixture(scope="module")
def tiny():
    return ours_from_hf(tiny_hf_model("llama")).model


@pytest.fixture
def gen(tiny, monkeypatch):
    """A TextGenerator over the tiny model; measuring the step cost fails the test (every
    check must come before it)."""
    import models.cost

    def no_measuring(*a, **k):
        raise AssertionError("the step cost was measured before the inputs were checked")

    monkeypatch.setattr(models.cost, "step_cost", no_measuring)
    return TextGenerator(tiny, CharTokenizer())


def fails(parse, argv, capsys) -> str:
    """The argparse error of ``parse(argv)`` (exit status 2), as printed."""
    with pytest.raises(SystemExit) as e:
        parse(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def sub(text: str, files: dict) -> str:
    """``{name}`` in ``text`` -> the path of that file."""
    for k, v in files.items():
        text = text.replace("{" + k + "}", v)
    return text


def curve(tmp_path, name="cost.json", **change) -> Path:
    cost = {"tokens": [1, 4, 16], "ms": [10.0, 11.0, 15.0], "per_seq_ms": 0.5, "context": 256, **change}
    path = tmp_path / name
    path.write_text(json.dumps({"cost": cost}))
    return path


# ----------------------------------------------------------------------------- python -m decoding

def _files(tmp: Path) -> dict:
    (tmp / "folder").mkdir(exist_ok=True)
    (tmp / "empty_model").mkdir(exist_ok=True)
    (tmp / "notes.txt").write_text("not a model")
    (tmp / "latin1.json").write_bytes(b'[{"role": "user", "content": "caf\xe9"}]')
    (tmp / "object.json").write_text(json.dumps({"role": "user", "content": "hi"}))
    (tmp / "system.json").write_text(json.dumps([{"role": "system", "content": "be brief"}]))
    (tmp / "blank.json").write_text(json.dumps([{"role": "user", "content": "  "}]))
    (tmp / "chat.json").write_text(json.dumps([{"role": "user", "content": "hi"}]))
    return {k: str(tmp / k) for k in ("folder", "empty_model", "notes.txt", "latin1.json", "object.json",
                                      "system.json", "blank.json", "chat.json")}


CLI_CASES = [
    (["hi", "--temperature", "nan"], "--temperature must be 0 (greedy) or a finite number >= 1e-06, got nan"),
    (["hi", "--temperature", "inf"], "--temperature must be 0 (greedy) or a finite number >= 1e-06, got inf"),
    (["hi", "--temperature", "1e-40"], "--temperature must be 0 (greedy) or a finite number >= 1e-06, got 1e-40"),
    (["hi", "--top-p", "nan"], "--top-p must be a number in (0, 1] (1 = off), got nan"),
    (["hi", "--top-p", "1.5"], "--top-p must be a number in (0, 1] (1 = off), got 1.5"),
    (["hi", "--top-k", "-3"], "--top-k must be an integer >= 0 (0 = off), got -3"),
    (["hi", "--seed", "-1"], "--seed must be an integer in [0, 2**44), got -1"),
    (["hi", "--seed", str(2 ** 70)], f"--seed must be an integer in [0, 2**44), got {2 ** 70}"),
    (["hi", "--device", "cuda:x"], "--device must be cpu, cuda or cuda:N, got 'cuda:x'"),
    (["hi", "--device", "CPU"], "--device must be cpu, cuda or cuda:N, got 'CPU'"),
    (["hi", "--max-new-tokens", "-5"], "--max-new-tokens must be an integer >= 1, got -5"),
    (["hi", "--stop", ""], "--stop must be a non-empty string or a list of non-empty strings, got ['']"),
    ([""], "the prompt is empty: give the text to answer"),
    (["   "], "the prompt is empty: give the text to answer"),
    (["--messages", "{chat.json}", "--no-chat-template"], "--no-chat-template feeds a prompt as raw text; "
                                                          "--messages is a chat"),
    (["--messages", "{folder}"], "--messages {folder}: is a folder, not a file"),
    (["--messages", "{latin1.json}"], "--messages {latin1.json}: not valid UTF-8"),
    (["--messages", "{object.json}"], "--messages {object.json}: 'messages' must be a list, not dict"),
    (["--messages", "{system.json}"], "--messages {system.json}: 'messages' has no 'user' message"),
    (["--messages", "{blank.json}"], "--messages {blank.json}: empty messages[0].content"),
    (["hi", "--method", "ar", "--draft-model", "smollm2"], "--draft-model smollm2: only the methods draft and "
                                                           "draft+pld use a draft model, and ar does not"),
    (["hi", "--method", "draft", "--draft-model", "/no/such/draft.gguf"],
     "--draft-model /no/such/draft.gguf: unknown model '/no/such/draft.gguf'"),
    (["hi", "--model", "/no/such/model"], "--model /no/such/model: unknown model '/no/such/model'"),
    (["hi", "--model", "{notes.txt}"], "--model {notes.txt}: model path '{notes.txt}' is a file but not a .gguf"),
    (["hi", "--model", "{empty_model}"], "--model {empty_model}: model folder '{empty_model}' has no config.json"),
    (["hi", "--lookahead", "1000,50,1000", "--no-plan"],
     "--lookahead 1000,50,1000: the window sends W*(N-1) = 1000*49 = 49000 tokens per step beside up to 64 "
     "candidates (lookahead+pld's max_verify), more than the 256 step tokens a sequence has room for: W*(N-1) must "
     "be at most 192"),
    (["hi", "--method", "hybrid", "--lookahead", "40,5,7"], "W*(N-1) must be at most 128"),
    (["hi", "--method", "ar", "--fixed-plan"], "--method ar sends one token per step and plans nothing"),
    (["hi", "--step-cost", "{folder}"], "--step-cost {folder}: is a folder, not a file"),
]


@pytest.mark.parametrize("argv, message", CLI_CASES, ids=[" ".join(a)[:40] for a, _ in CLI_CASES])
def test_cli_rejects_before_loading(argv, message, tmp_path, capsys):
    files = _files(tmp_path)
    err = fails(cli_args, [sub(a, files) for a in argv], capsys)
    assert sub(message, files) in err, err


STEP_COST_CASES = [
    (dict(tokens=[1, 4, 4]), "tokens must increase, got [1, 4, 4]: step size 4 is repeated"),
    (dict(tokens=[1, 16, 4]), "tokens must increase, got [1, 16, 4]: 4 follows 16"),
    (dict(tokens=[0, 4, 16]), "tokens must be a list of at least two step sizes (integers >= 1)"),
    (dict(ms=[10.0, float("inf"), 15.0]), "ms must be finite costs > 0 (ms), got inf"),
    (dict(ms=[10.0, float("nan"), 15.0]), "ms must be finite costs > 0 (ms), got nan"),
    (dict(ms=[0.0, 11.0, 15.0]), "ms must be finite costs > 0 (ms), got 0.0"),
    (dict(ms=[10.0, 11.0]), "ms must be a list of 3 costs (one per step size)"),
    (dict(ms=[10.0, 9.0, 15.0]), "ms must not fall as the step grows"),
    (dict(per_seq_ms=-1.0), "per_seq_ms must be a finite number >= 0, got -1.0"),
    (dict(context=0), "context must be an integer >= 1, got 0"),
    (dict(long_context=512, long_tokens=[1, 1], long_ms=[12.0, 13.0]), "long_tokens must increase"),
    (dict(speed="fast"), "the curve has unknown fields speed"),
]


@pytest.mark.parametrize("change, message", STEP_COST_CASES, ids=[m[:30] for _, m in STEP_COST_CASES])
def test_cli_step_cost_files_rejected_at_parse_time(change, message, tmp_path, capsys):
    path = curve(tmp_path, **change)
    err = fails(cli_args, ["hi", "--step-cost", str(path)], capsys)
    assert f"--step-cost: step-cost file {path} is not a usable step-cost curve: {message}" in err, err


def test_cli_step_cost_file_that_is_not_a_curve(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert f"step-cost file {bad} is not JSON" in fails(cli_args, ["hi", "--step-cost", str(bad)], capsys)
    bad.write_text(json.dumps({"tokens": [1, 2]}))
    assert f"step-cost file {bad} has no 'cost' entry" in fails(cli_args, ["hi", "--step-cost", str(bad)], capsys)
    ok = curve(tmp_path)
    assert cli_args(["hi", "--step-cost", str(ok)]).step_cost_curve.tokens == [1, 4, 16]


def test_cli_accepts_what_it_should():
    """The limits are not too tight: the lookahead window is only checked for the methods
    that have one, and the largest window that fits is accepted."""
    assert cli_args(["hi", "--method", "ar", "--lookahead", "1000,50,1000"]).lookahead_wng == (1000, 50, 1000)
    assert cli_args(["hi", "--lookahead", "48,5,7"]).lookahead_wng == (48, 5, 7)  # 48 * 4 + 64 = 256
    assert cli_args(["hi", "--temperature", "0.7", "--seed", str(2 ** 44 - 1)]).seed == 2 ** 44 - 1
    assert cli_args(["hi", "--method", "draft", "--draft-model", "smollm2"]).draft_model == "smollm2"


def test_cli_stop_unescapes_newlines_tabs_and_backslashes():
    """--stop "\\n\\n" (as the README writes it; a shell passes backslash-n) is two newlines."""
    args = cli_args(["hi", "--stop", r"\n\n", "--stop", r"a\tb", "--stop", r"c\\n", "--stop", r"\d"])
    assert args.stop == ["\n\n", "a\tb", "c\\n", "\\d"]
    assert inputs.unescape(r"x\\\n") == "x\\\n"


# ----------------------------------------------------------------------------- the CLI after the model loads

@pytest.fixture
def fake_load(tiny, monkeypatch):
    """``python -m decoding`` with the tiny model and the character tokenizer in place of the
    real loads; generating fails the test unless a test allows it."""
    import models.loader
    from models.loader import LoadedModel

    monkeypatch.setattr(TextGenerator, "load", classmethod(lambda cls, *a, **k: cls(tiny, CharTokenizer())))
    monkeypatch.setattr(models.loader, "load_model", lambda *a, **k: LoadedModel(tiny, CharTokenizer(swap=True)))

    def no_generating(*a, **k):
        raise AssertionError("generation started before the inputs were checked")

    monkeypatch.setattr(TextGenerator, "generate", no_generating)


def test_cli_names_max_new_tokens_past_the_context_before_the_step_cost(fake_load):
    with pytest.raises(ValueError, match=r"--max-new-tokens 300: the prompt has 5 tokens and the model's context is "
                                         r"256, so at most 251 new tokens fit"):
        cli_main(["hello", "--max-new-tokens", "300"])


def test_cli_compares_the_draft_tokenizer_before_generating(fake_load):
    """Same size (27 tokens), two ids swapped: another tokenizer, caught right after the load."""
    with pytest.raises(ValueError, match=r"--draft-model smollm2 has another tokenizer than --model smollm2: 2 tokens "
                                         r"have other ids \(e.g. 'a': 2 there, 1 in the target\)"):
        cli_main(["hello", "--method", "draft", "--draft-model", "smollm2", "--no-plan", "--max-new-tokens", "8"])


def test_cli_says_cache_exhaustion_in_flags(fake_load, monkeypatch):
    from models.kv_cache import KVCacheFull

    def full(*a, **k):
        raise KVCacheFull(25, 20, 22, 16)

    monkeypatch.setattr(TextGenerator, "generate", full)
    with pytest.raises(ValueError) as e:
        cli_main(["hello", "--no-plan", "--max-new-tokens", "8"])
    msg = str(e.value)
    assert "a step needed 25 more blocks of 16 tokens, 20 of 22 were free" in msg and "--lookahead W or N" in msg
    assert "num_blocks" not in msg and "cache_tokens" not in msg


def test_cli_without_a_chat_template(tiny, monkeypatch):
    monkeypatch.setattr(TextGenerator, "load",
                        classmethod(lambda cls, *a, **k: cls(tiny, CharTokenizer(chat_template=None))))
    with pytest.raises(ValueError, match="this model's tokenizer has no chat template: feed prompts as raw text "
                                         r"\(chat_template=False; on the command line --no-chat-template\)"):
        cli_main(["hello", "--no-plan", "--max-new-tokens", "8"])


# ----------------------------------------------------------------------------- bench/run.py

def test_bench_out_that_is_a_file_fails_at_once(tmp_path, capsys):
    """The whole run used to go ahead and then die in mkdir, losing every result."""
    f = tmp_path / "results.txt"
    f.write_text("an earlier file")
    assert f"--out {f}: is a file, not a folder" in fails(bench_args, ["--out", str(f)], capsys)
    assert f"--out {f / 'sub'}: {f} is a file, so no folder can be made under it" in fails(
        bench_args, ["--out", str(f / "sub")], capsys)
    assert f.read_text() == "an earlier file"
    assert bench_args(["--out", str(tmp_path / "new" / "deeper")]).out == tmp_path / "new" / "deeper"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_bench_out_not_writable(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert f"--out {ro / 'x'}: {ro} is not writable" in fails(bench_args, ["--out", str(ro / "x")], capsys)
    finally:
        ro.chmod(0o700)


def test_bench_out_subprocess_no_traceback(tmp_path):
    import subprocess

    f = tmp_path / "taken"
    f.write_text("")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--out", str(f)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"error: --out {f}: is a file, not a folder" in proc.stderr


BENCH_CASES = [
    (["--methods", ""], "--methods: give at least one of ar,pld,"),
    (["--methods", ",,"], "--methods: give at least one of ar,pld,"),
    (["--methods", "pld,hf-pld"], "--methods: unknown ['hf-pld']; choose from"),
    (["--methods", "pld,hf-pld"], "(hf-pld: transformers' baselines come with --compare-hf)"),
    (["--methods", "draft"], "--methods draft needs --draft-model"),
    (["--methods", "pld", "--draft-model", "smollm2"], "--draft-model smollm2: only the methods draft and draft+pld "
                                                       "use a draft model, and ar,pld does not"),
    (["--tasks", "nosuch"], "--tasks: unknown ['nosuch']; the suite's tasks are chat,code,summarization,qa,code_edit"),
    (["--tasks", ","], "--tasks: give at least one task, got ','"),
    (["--prompts", "{folder}"], "--prompts {folder}: is a folder, not a file"),
    (["--prompts", "{folder}/none.jsonl"], "--prompts {folder}/none.jsonl: no such file"),
    (["--prompts", "{prompts.jsonl}", "--split", "dev"], "--split dev picks a part of the built-in suite; it does "
                                                         "not apply to --prompts"),
    (["--emulate-cost", "{folder}"], "--emulate-cost {folder}: is a folder, not a file"),
    (["--temperature", "nan"], "--temperature must be 0 (greedy) or a finite number >= 1e-06, got nan"),
    (["--batch-size", "0"], "--batch-size must be an integer >= 1, got 0"),
    (["--repeats", "-2"], "--repeats must be an integer >= 1, got -2"),
    (["--lookahead", "40,5,7"], "--lookahead 40,5,7: the window sends W*(N-1) = 40*4 = 160 tokens per step beside "
                                "up to 128 candidates (hybrid's candidate nodes)"),
    (["--model", "/no/such.gguf"], "--model /no/such.gguf: unknown model"),
]


@pytest.mark.parametrize("argv, message", BENCH_CASES, ids=[" ".join(a)[:40] for a, _ in BENCH_CASES])
def test_bench_rejects_before_loading(argv, message, tmp_path, capsys):
    (tmp_path / "folder").mkdir()
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"task": "qa", "prompt": "hi"}) + "\n")
    files = {"folder": str(tmp_path / "folder"), "prompts.jsonl": str(tmp_path / "prompts.jsonl")}
    err = fails(bench_args, [sub(a, files) for a in argv] + ["--out", str(tmp_path / "out")], capsys)
    assert sub(message, files) in err, err


def test_bench_accepts_repeated_methods_once_and_a_draft_for_hf_assisted(tmp_path):
    args = bench_args(["--methods", "pld, pld,ar", "--out", str(tmp_path)])
    assert args.methods == ["pld", "ar"]
    args = bench_args(["--methods", "pld", "--draft-model", "smollm2", "--compare-hf", "--out", str(tmp_path)])
    assert args.draft_model == "smollm2" and args.split == "test"


def test_bench_tasks_missing_from_the_prompt_file(tmp_path):
    p = tmp_path / "mine.jsonl"
    p.write_text(json.dumps({"task": "qa", "prompt": "hi"}) + "\n" + json.dumps({"task": "code", "prompt": "x"}))
    args = bench_args(["--prompts", str(p), "--tasks", "chat", "--out", str(tmp_path / "o")])
    with pytest.raises(ValueError, match=f"--tasks chat: {p} has no record of these tasks; its tasks are code,qa"):
        load_records(args)


def test_bench_compares_the_draft_tokenizer_after_loading(tiny, tmp_path, monkeypatch):
    import models.loader
    from bench.loop import Bench
    from bench.measure import PeakMemory
    from models.loader import LoadedModel

    toks = iter([CharTokenizer(), CharTokenizer(swap=True)])
    monkeypatch.setattr(models.loader, "load_model", lambda *a, **k: LoadedModel(tiny, next(toks)))
    args = bench_args(["--methods", "draft", "--draft-model", "smollm2", "--no-plan", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--draft-model smollm2 has another tokenizer than --model smollm2: 2 tokens"):
        Bench(args, PeakMemory("cpu"))


# ----------------------------------------------------------------------------- the Python API

class _NotAModel:
    pass


API_CASES = [
    (dict(max_new_tokens=-1), "max_new_tokens must be an integer >= 0, got -1"),
    (dict(max_new_tokens=5.5), "max_new_tokens must be an integer >= 0, got 5.5"),
    (dict(max_new_tokens="5"), "max_new_tokens must be an integer >= 0, got '5'"),
    (dict(max_new_tokens=1000), "prompt 0 has 5 tokens; with max_new_tokens=1000 it needs 1005 positions, the "
                                "model context is 256"),
    (dict(sampling={"temperature": 0.7}), "sampling must be a SamplingParams"),
    (dict(temperature=0.7), r"temperature is a sampling setting: pass sampling=SamplingParams\(temperature=...\)"),
    (dict(max_tokens=5), "TextGenerator.generate has no argument 'max_tokens' \\(did you mean max_new_tokens\\?\\)"),
    (dict(stop=5), "stop must be a non-empty string or a list of non-empty strings, got 5"),
    (dict(stop=["ok", None]), r"stop must be a non-empty string or a list of non-empty strings, got \['ok', None\]"),
    (dict(stream="print"), "stream must be a function stream\\(index, piece\\) or None, got 'print'"),
    (dict(method="nosuch"), "method must be a Proposer or one of ar, pld,"),
    (dict(method=3), "method must be a Proposer or one of ar, pld,"),
    (dict(prompts=123), "prompts must be a prompt \\(a string or chat messages\\) or a list of prompts, got int"),
    (dict(prompts=""), "prompt is empty: give the text to answer"),
    (dict(prompts=["fine", " "]), "prompt 1 is empty"),
    (dict(prompts=[{"role": "robot", "content": "x"}]), "prompt: messages\\[0\\] has unknown role 'robot'"),
    (dict(method="draft"), "method 'draft' needs draft_model="),
    (dict(method="pld", draft_model="gen"), "draft_model is for the methods 'draft' and 'draft\\+pld'; method 'pld'"),
    (dict(method="draft", draft_model="other"), "draft_model has another tokenizer than this TextGenerator's model: "
                                                "2 tokens have other ids"),
    (dict(method="draft", draft_model=_NotAModel()), "draft_model must be a TextGenerator or load_model's result"),
]


@pytest.mark.parametrize("kw, message", API_CASES, ids=[m[:40] for _, m in API_CASES])
def test_api_rejects_before_measuring_or_generating(gen, kw, message):
    kw = dict(kw)
    prompts = kw.pop("prompts", "hello")
    method = kw.pop("method", "pld")
    if kw.get("draft_model") == "gen":
        kw["draft_model"] = gen
    elif kw.get("draft_model") == "other":
        kw["draft_model"] = TextGenerator(gen.model, CharTokenizer(swap=True))
    with pytest.raises(ValueError, match=message):
        gen.generate(prompts, method, **kw)


@pytest.mark.parametrize("kw, message", [
    (dict(temperature=float("nan")), "temperature must be 0 \\(greedy\\) or a finite number >= 1e-06, got nan"),
    (dict(temperature=float("inf")), "temperature must be 0 \\(greedy\\) or a finite number >= 1e-06, got inf"),
    (dict(temperature="0.7"), "temperature must be 0 \\(greedy\\) or a finite number >= 1e-06, got '0.7'"),
    (dict(top_k=2.5), "top_k must be an integer >= 0 \\(0 = off\\), got 2.5"),
    (dict(top_p=float("nan")), "top_p must be a number in \\(0, 1\\] \\(1 = off\\), got nan"),
    (dict(temperature=1.0, seed=-1), "seed must be an integer in \\[0, 2\\*\\*44\\), got -1"),
    (dict(temperature=True), "temperature must be 0 \\(greedy\\) or a finite number"),
])
def test_sampling_params_reject_what_the_flags_reject(kw, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kw)


def test_method_configs_reject_a_window_that_cannot_fit_a_step():
    with pytest.raises(ValueError, match=r"LookaheadConfig\(window=1000, ngram=50\): the window sends W\*\(N-1\) = "
                                         r"1000\*49 = 49000 tokens per step .* must be at most 192"):
        LookaheadConfig(window=1000, ngram=50)
    with pytest.raises(ValueError, match=r"HybridConfig\(lookahead=LookaheadConfig\(window=40, ngram=5\)\): .* at "
                                         r"most 128"):
        HybridConfig(lookahead=LookaheadConfig(window=40, ngram=5))
    assert LookaheadConfig(window=48, ngram=5).window == 48


def test_api_stop_string_is_one_string_not_its_characters(gen):
    """stop="xyz" is the stop string "xyz" (as stop=["xyz"]), not the characters x, y, z."""
    full = gen.generate("hello there", "ar", max_new_tokens=40, eos_token_ids=())[0].text
    stop = full[20:23]
    assert full.find(stop) > min(full.find(c) for c in stop)  # read as characters, it would cut earlier
    one = gen.generate("hello there", "ar", max_new_tokens=40, eos_token_ids=(), stop=stop)[0]
    assert one.finish_reason == "stop" and one.text == full[:full.find(stop)]
    assert gen.generate("hello there", "ar", max_new_tokens=40, eos_token_ids=(), stop=[stop])[0].text == one.text
    assert gen.generate("hello there", "ar", max_new_tokens=40, eos_token_ids=(), stop=None)[0].text == full


def test_api_draft_model_with_the_same_tokenizer_runs(gen):
    """draft_model= with the same vocabulary: the draft method runs and, greedy, gives ar's text."""
    same = TextGenerator(gen.model, CharTokenizer())
    ar = gen.generate("hello there", "ar", max_new_tokens=12, eos_token_ids=())[0]
    d = gen.generate("hello there", "draft", max_new_tokens=12, eos_token_ids=(), plan=False, draft_model=same)[0]
    assert d.token_ids == ar.token_ids


def test_generate_checks_a_draft_models_vocabulary_before_the_first_token(tiny):
    """A draft model of another vocabulary size fails before the prefill: nothing streamed."""
    from decoding import generate, make_proposer

    small = ours_from_hf(tiny_hf_model("llama", vocab_size=64)).model
    seen = []
    with pytest.raises(ValueError, match=r"draft model vocabulary \(64 tokens\) differs from the target's \(97\)"):
        generate(tiny, [[1, 2, 3]], make_proposer("draft", draft_model=small), max_new_tokens=4,
                 on_tokens=lambda i, t: seen.append(t))
    assert seen == []


def test_tokenizer_comparison_reports_missing_and_extra_tokens():
    class V:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

    inputs.same_tokenizer(V({"a": 1, "b": 2}), V({"b": 2, "a": 1}))  # the same map, any order
    with pytest.raises(ValueError, match=r"1 of the target's 2 tokens are missing \(e.g. 'b'\); 1 tokens are not the "
                                         r"target's \(e.g. 'c'\)"):
        inputs.same_tokenizer(V({"a": 1, "b": 2}), V({"a": 1, "c": 2}))


def test_stream_holds_back_what_may_begin_a_stop_string(gen):
    """The streamed pieces add up to the result's text even when a stop string's first
    characters arrived in an earlier piece than its last ones."""
    full = gen.generate("hello there", "ar", max_new_tokens=40, eos_token_ids=())[0].text
    stop = full[20:24]  # four characters, one token each: they arrive over four steps
    pieces = []
    r = gen.generate("hello there", "ar", max_new_tokens=40, eos_token_ids=(), stop=[stop, "zz"],
                     stream=lambda i, p: pieces.append(p))[0]
    assert r.finish_reason == "stop" and "".join(pieces) == r.text == full[:full.find(stop)]
    pieces.clear()
    r = gen.generate("hello there", "ar", max_new_tokens=40, eos_token_ids=(), stop=[full[-1] + "z"],
                     stream=lambda i, p: pieces.append(p))[0]  # the last character may begin it: held back
    assert r.finish_reason == "length" and "".join(pieces) == r.text == full and pieces[-1].endswith(full[-1])


@pytest.mark.parametrize("prompts, kw, message", [
    ("hello", {}, "prompts must be a list of prompts, each a list of token ids, got str; text goes to "
                  "TextGenerator.generate"),
    (["hello"], {}, "prompt 0 must be a list of token ids, got str; text goes to TextGenerator.generate"),
    ([1, 2, 3], {}, r"prompt 0 must be a list of token ids, got int \(one prompt is \[ids\]: a list of one list\)"),
    ([[1.5, 2]], {}, "prompt 0: token ids must be integers, got 1.5"),
    ([[1, 2]], dict(max_new_tokens=2.0), "max_new_tokens must be an integer >= 0, got 2.0"),
    ([[1, 2]], dict(sampling={"temperature": 1}), "sampling must be a SamplingParams"),
    ([[1, 2]], dict(proposer="pld"), r"proposer must be a Proposer \(make_proposer\(NAME\)\) or None, got 'pld'"),
])
def test_token_api_rejects_what_is_not_token_ids(tiny, prompts, kw, message):
    from decoding import generate

    with pytest.raises(ValueError, match=message):
        generate(tiny, prompts, kw.pop("proposer", None), **kw)


def test_load_tokenizer_reads_a_tokenizer_without_its_weights():
    """What the benchmark compares a transformers-only draft (hf-assisted) with."""
    from models.loader import load_tokenizer

    tok = load_tokenizer("smollm2")
    assert len(tok.get_vocab()) > 10_000 and tok.chat_template
    inputs.same_tokenizer(tok, load_tokenizer(None), "--model smollm2", "--draft-model smollm2")
    with pytest.raises(ValueError, match="unknown model '/no/such/folder'"):
        load_tokenizer("/no/such/folder")
