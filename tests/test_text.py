"""Text in, text out: TextGenerator (strings, chat messages, stop strings, streaming, EOS) and
the CLI ``python -m decoding`` on the embedded default model."""

import io
import json

import pytest

from decoding import TextGenerator
from decoding.cli import main, parse_args

QUESTION = "What is the capital of France? Answer in one sentence."


@pytest.fixture(scope="module")
def gen(smol):
    return TextGenerator(smol.model, smol.tokenizer)


@pytest.fixture(scope="module")
def ar_answer(gen):
    return gen.generate(QUESTION, "ar", max_new_tokens=48)[0]


def test_string_prompt_gives_the_decoded_answer_without_eos(gen, ar_answer):
    r = ar_answer
    eos = set(gen.model.cfg.eos_token_ids)
    assert r.finish_reason == "eos" and r.token_ids[-1] in eos  # this answer ends by itself
    assert r.text == gen.tokenizer.decode(r.token_ids[:-1], skip_special_tokens=True)
    assert "Paris" in r.text and "<|im_end|>" not in r.text
    assert r.prompt_tokens == len(gen.encode(QUESTION))


def test_chat_messages_and_methods_give_the_same_greedy_text(gen, ar_answer):
    msgs = [{"role": "user", "content": QUESTION}]
    assert gen.generate(msgs, "ar", max_new_tokens=48)[0].text == ar_answer.text
    for method in ("pld", "lookahead+pld"):
        assert gen.generate([QUESTION], method, max_new_tokens=48, plan=False)[0].text == ar_answer.text


def test_stop_string_cuts_the_text_and_the_stream(gen, ar_answer):
    full = ar_answer.text
    stop = full.split()[3]  # a word in the middle of the answer
    pieces = []
    r = gen.generate(QUESTION, "pld", max_new_tokens=48, stop=[stop, "never-appears"], plan=False,
                     stream=lambda i, p: pieces.append((i, p)))[0]
    assert r.finish_reason == "stop"
    assert r.text == full[:full.find(stop)]
    assert "".join(p for _, p in pieces) == r.text and {i for i, _ in pieces} == {0}
    assert len(r.token_ids) < len(ar_answer.token_ids)


def test_streamed_pieces_add_up_to_the_text_in_a_batch(gen):
    prompts = [QUESTION, "Write a Python function that adds two numbers."]
    pieces = {0: [], 1: []}
    res = gen.generate(prompts, "lookahead+pld", max_new_tokens=24, plan=False,
                       stream=lambda i, p: pieces[i].append(p))
    for i, r in enumerate(res):
        assert "".join(pieces[i]) == r.text and r.text


def test_text_errors(gen):
    with pytest.raises(ValueError, match="prompts is empty"):
        gen.generate([], "ar")
    with pytest.raises(ValueError, match="stop must be a non-empty string or a list of non-empty strings"):
        gen.generate(QUESTION, "ar", stop=[""])
    with pytest.raises(ValueError, match=r"prompt 0: messages\[0\] is missing field 'content'"):
        gen.generate([[{"role": "user"}]], "ar")


# --- the CLI ---------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["hi", "--lookahead", "7,5"], "--lookahead takes 3 comma-separated integers"),
    (["hi", "--lookahead", "7,1,7"], "--lookahead '7,1,7': each value must be >="),
    (["hi", "--pld", "x"], "--pld takes 2 comma-separated integers"),
    (["hi", "--temperature", "-1"], "--temperature"),
    (["hi", "--top-p", "0"], "--top-p"),
    (["hi", "--max-new-tokens", "0"], "--max-new-tokens must be an integer >= 1, got 0"),
    (["hi", "--pld-candidates", "0"], "--pld-candidates must be an integer >= 1, got 0"),
    (["hi", "--method", "draft"], "--method draft needs --draft-model"),
    ([], "give a prompt or --messages FILE"),
    (["hi", "--device", "tpu"], "--device must be cpu, cuda or cuda:N"),
    (["hi", "--no-plan", "--fixed-plan"], "--step-cost and --fixed-plan size the planner's steps"),
    (["hi", "--step-cost", "/nonexistent/step_cost.json"], "--step-cost /nonexistent/step_cost.json: no such file"),
])
def test_cli_rejects_bad_flags_before_loading(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_cli_device_cuda_without_cuda(monkeypatch, capsys):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        parse_args(["hi", "--device", "cuda"])
    assert "--device cuda: no CUDA device is available" in capsys.readouterr().err


def test_cli_messages_file_errors(tmp_path, capsys):
    missing = tmp_path / "nope.json"
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps([{"role": "robot", "content": "x"}]))
    for path, message in [(missing, "no such file"), (bad, "not JSON"),
                          (wrong, "messages[0] has unknown role 'robot'")]:
        with pytest.raises(SystemExit):
            parse_args(["--messages", str(path)])
        assert f"--messages {path}: {message}" in capsys.readouterr().err


def test_cli_streams_the_answer_and_reports_tau(smol, ar_answer, tmp_path):
    msgs = tmp_path / "chat.json"
    msgs.write_text(json.dumps([{"role": "user", "content": QUESTION}]))
    out, err = io.StringIO(), io.StringIO()
    assert main(["--messages", str(msgs), "--method", "pld", "--max-new-tokens", "48", "--no-plan"],
                out=out, err=err) == 0
    assert out.getvalue() == ar_answer.text + "\n"
    report = err.getvalue()
    assert "[pld] " in report and "tokens/s" in report and "tau " in report and "finish: eos" in report
    assert "tokens gained per step -> steps: 1: " in report


def test_cli_plans_with_a_pinned_step_cost(smol, ar_answer, tmp_path):
    """--step-cost FILE --fixed-plan: the planner sizes steps from that curve alone, so two runs
    plan the same steps (same tau, same tokens gained per step); a curve where a second token
    costs 10x one sends no drafts at all. Greedy output stays the autoregressive answer."""
    import re

    from models.cost import StepCost, save_step_cost

    save_step_cost(StepCost([1, 64], [10.0, 10.5], 0.0, 256), tmp_path / "cheap.json")
    save_step_cost(StepCost([1, 2], [10.0, 100.0], 0.0, 256), tmp_path / "dear.json")

    def run(curve):
        out, err = io.StringIO(), io.StringIO()
        assert main([QUESTION, "--method", "lookahead+pld", "--max-new-tokens", "48", "--fixed-plan",
                     "--step-cost", str(tmp_path / curve)], out=out, err=err) == 0
        assert out.getvalue() == ar_answer.text + "\n"
        report = err.getvalue()
        return float(re.search(r"tau ([0-9.]+)", report).group(1)), report.split("\n")[1]

    cheap, again, dear = run("cheap.json"), run("cheap.json"), run("dear.json")
    assert cheap == again
    assert dear[0] == 1.0 and re.fullmatch(r"tokens gained per step -> steps: 1: \d+", dear[1])
    assert cheap[0] > 1.0, cheap


def test_cli_stop_as_the_readme_writes_it(smol):
    r"""The README's `--stop "\n\n"` (a shell passes a backslash and an n): the CLI reads it as
    a blank line, and the answer stops there."""
    out, err = io.StringIO(), io.StringIO()
    assert main(["def fib(n):", "--no-chat-template", "--method", "pld", "--max-new-tokens", "64", "--stop", r"\n\n",
                 "--no-plan"], out=out, err=err) == 0
    assert "finish: stop" in err.getvalue(), err.getvalue()
    text = out.getvalue()[:-1]  # the CLI ends the answer with one newline
    assert "\n" in text and "\n\n" not in text and not text.endswith("\n")


# --- the text layer's hold-back, with a byte-level fake tokenizer (no model) -------------------

class ByteTokenizer:
    """Token i is one byte: 0..127 ASCII, 195 and 169 the two bytes of 'é' (0xC3 0xA9)."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(i for i in ids if i != 0).decode("utf-8", errors="replace")


def test_detokenizer_holds_back_an_incomplete_utf8_character():
    from decoding.text import _Detokenizer

    d = _Detokenizer(ByteTokenizer(), eos={0})
    assert d.push([ord("c"), ord("a"), ord("f")]) == "caf"
    assert d.push([0xC3]) == "" and d.text == "caf"  # half of 'é': nothing goes out yet
    assert d.push([0xA9, ord("!")]) == "é!" and d.text == "café!"
    assert d.push([0]) == ""  # EOS never reaches the text
    assert d.text == "café!"


def test_stop_prefix_holds_back_what_may_begin_a_stop_string():
    from decoding.text import _stop_prefix

    assert _stop_prefix("abc\n", ["\n\n"]) == 1  # a newline that may be the first of "\n\n"
    assert _stop_prefix("abc", ["\n\n"]) == 0
    assert _stop_prefix("say EN", ["END", "ENOUGH"]) == 2  # the longest end that begins one
    assert _stop_prefix("xE", ["END", "E"]) == 1
    assert _stop_prefix("", ["END"]) == 0


def test_stop_string_spanning_tokens_and_an_accepted_draft(gen, ar_answer):
    """A stop string made of the end of one token and the start of the next (and reached inside
    one step's accepted tokens, with pld): the text is cut before it, the stream never shows a
    character of it, and the pieces add up to the text."""
    tok = gen.tokenizer
    ids = ar_answer.token_ids[:-1]
    pieces = [tok.decode(ids[:i], skip_special_tokens=True) for i in range(len(ids) + 1)]
    # a boundary between two tokens of at least 2 characters each, past the first few tokens
    i = next(i for i in range(4, len(ids) - 1) if len(pieces[i]) - len(pieces[i - 1]) >= 2
             and len(pieces[i + 1]) - len(pieces[i]) >= 2)
    stop = pieces[i][-2:] + pieces[i + 1][len(pieces[i]):len(pieces[i]) + 2]
    full = ar_answer.text
    assert stop in full
    streamed = []
    r = gen.generate(QUESTION, "pld", max_new_tokens=48, stop=stop, plan=False,
                     stream=lambda j, p: streamed.append(p))[0]
    assert r.finish_reason == "stop" and r.text == full[:full.find(stop)]
    assert "".join(streamed) == r.text


@pytest.mark.parametrize("method", ["pld", "suffix"])
def test_a_sampled_answer_stops_at_a_stop_string_spanning_tokens(gen, method):
    """With sampling (seeded) and drafts: the same answer cut before a stop string made of the
    end of one token and the start of the next; the stream shows none of it."""
    from decoding.sampling import SamplingParams

    sp = SamplingParams(temperature=0.7, top_k=20, seed=11)
    free = gen.generate(QUESTION, method, max_new_tokens=48, sampling=sp, plan=False)[0]
    tok, ids = gen.tokenizer, free.token_ids[:-1]
    pieces = [tok.decode(ids[:i], skip_special_tokens=True) for i in range(len(ids) + 1)]
    i = next(i for i in range(4, len(ids) - 1) if len(pieces[i]) - len(pieces[i - 1]) >= 2
             and len(pieces[i + 1]) - len(pieces[i]) >= 2)
    stop = pieces[i][-2:] + pieces[i + 1][len(pieces[i]):len(pieces[i]) + 2]
    assert stop in free.text
    streamed = []
    r = gen.generate(QUESTION, method, max_new_tokens=48, sampling=sp, stop=stop, plan=False,
                     stream=lambda j, p: streamed.append(p))[0]
    assert r.finish_reason == "stop" and r.text == free.text[:free.text.find(stop)]
    assert "".join(streamed) == r.text
