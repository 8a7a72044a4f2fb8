"""The prompt-suite loader (bench/data/suite.py) and the shipped suite.jsonl. No model, no tokenizer."""

import json
from pathlib import Path

import pytest

from bench.data.suite import SUITE_PATH, TASKS, load_prompt_file, load_suite, user_turns


def write(tmp_path: Path, lines, name="prompts.jsonl") -> Path:
    """Lines given as dicts are JSON-encoded; strings are written verbatim."""
    p = tmp_path / name
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n"
    p.write_text(text, encoding="utf-8")
    return p


GOOD = {"task": "chat", "prompt": "Hello there"}


# ----------------------------------------------------------------------------- user prompt files


def test_good_file(tmp_path):
    p = write(
        tmp_path,
        [
            {"task": "chat", "prompt": "Write a haiku."},
            "",
            {
                "task": "code",
                "id": "mine",
                "messages": [
                    {"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Reverse a list in Python."},
                    {"role": "assistant", "content": "xs[::-1]"},
                    {"role": "user", "content": "And in place?"},
                ],
                "reference": "xs.reverse()",
            },
            "   ",
            {"task": "qa", "id": 7, "prompt": "Why?"},
        ],
    )
    recs = load_prompt_file(p)
    assert [r["id"] for r in recs] == ["prompts-1", "mine", "7"]
    assert recs[0]["task"] == "chat"
    assert recs[0]["messages"] == [{"role": "user", "content": "Write a haiku."}]
    assert recs[0]["prompt"] == "Write a haiku."
    assert len(recs[1]["messages"]) == 4 and recs[1]["messages"][-1]["content"] == "And in place?"
    assert recs[1]["reference"] == "xs.reverse()"  # extra fields are kept
    assert recs[2]["messages"][0]["content"] == "Why?"


def test_accepts_str_path_and_no_trailing_newline(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps(GOOD), encoding="utf-8")
    assert load_prompt_file(str(p))[0]["id"] == "x-1"


BAD_LINES = [
    ("{not json", "invalid JSON"),
    ('["task", "prompt"]', "expected a JSON object"),
    ({"prompt": "hi"}, "missing field 'task'"),
    ({"task": "chat"}, "missing field 'prompt' or 'messages'"),
    ({"task": "chat", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}, "both"),
    ({"task": "chat", "prompt": ""}, "empty 'prompt'"),
    ({"task": "chat", "prompt": "   \n"}, "empty 'prompt'"),
    ({"task": "chat", "prompt": 42}, "'prompt' must be a string"),
    ({"task": 3, "prompt": "hi"}, "'task' must be a string"),
    ({"task": "", "prompt": "hi"}, "empty 'task'"),
    ({"task": "chat", "messages": "hi"}, "'messages' must be a list"),
    ({"task": "chat", "messages": []}, "empty 'messages'"),
    ({"task": "chat", "messages": ["hi"]}, "messages[0] must be an object"),
    ({"task": "chat", "messages": [{"content": "hi"}]}, "missing field 'role'"),
    ({"task": "chat", "messages": [{"role": "user"}]}, "missing field 'content'"),
    ({"task": "chat", "messages": [{"role": "robot", "content": "hi"}]}, "unknown role 'robot'"),
    ({"task": "chat", "messages": [{"role": 1, "content": "hi"}]}, "role must be a string"),
    ({"task": "chat", "messages": [{"role": "user", "content": ""}]}, "empty messages[0].content"),
    ({"task": "chat", "messages": [{"role": "user", "content": ["a"]}]}, "content must be a string"),
    ({"task": "chat", "messages": [{"role": "system", "content": "be nice"}]}, "no 'user' message"),
    ({"task": "chat", "prompt": "hi", "id": ["x"]}, "'id' must be a string or an int"),
    ({"task": "chat", "prompt": "hi", "id": ""}, "empty 'id'"),
]


@pytest.mark.parametrize("bad,expected", BAD_LINES, ids=[e for _, e in BAD_LINES])
def test_malformed_line_names_file_line_and_problem(tmp_path, bad, expected):
    # good line 1, blank line 2, good line 3, the bad line is line 4
    p = write(tmp_path, [GOOD, "", dict(GOOD, id="b"), bad, dict(GOOD, id="c")])
    with pytest.raises(ValueError) as info:
        load_prompt_file(p)
    msg = str(info.value)
    assert str(p) in msg
    assert "line 4:" in msg
    assert expected in msg


def test_duplicate_id(tmp_path):
    p = write(tmp_path, [dict(GOOD, id="a"), dict(GOOD, id="a")])
    with pytest.raises(ValueError, match=r"line 2: duplicate id 'a' \(first on line 1\)"):
        load_prompt_file(p)


def test_bad_utf8(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(json.dumps(GOOD).encode() + b"\n" + b'{"task": "chat", "prompt": "\xff"}\n')
    with pytest.raises(ValueError, match=r"line 2: not valid UTF-8"):
        load_prompt_file(p)


@pytest.mark.parametrize("content", ["", "\n\n", "  \n\t\n"])
def test_empty_file(tmp_path, content):
    p = tmp_path / "empty.jsonl"
    p.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match="empty file") as info:
        load_prompt_file(p)
    assert str(p) in str(info.value)


# ----------------------------------------------------------------------------- built-in suite


@pytest.fixture(scope="module")
def suite():
    return load_suite()


def test_suite_file_is_shipped():
    assert SUITE_PATH.name == "suite.jsonl" and SUITE_PATH.exists()
    assert SUITE_PATH.stat().st_size < 2_000_000


def test_suite_has_all_tasks_and_splits(suite):
    assert {r["task"] for r in suite} == set(TASKS)
    for task in TASKS:
        splits = {r["split"] for r in suite if r["task"] == task}
        assert splits == {"dev", "test"}, task
    ids = [r["id"] for r in suite]
    assert len(ids) == len(set(ids))


def test_suite_records_are_well_formed(suite):
    for r in suite:
        assert isinstance(r["id"], str) and r["id"]
        assert isinstance(r["source"], str) and r["source"]
        assert isinstance(r["license"], str) and r["license"]
        turns = user_turns(r)
        assert turns and all(isinstance(t, str) and t.strip() for t in turns), r["id"]
        if r["task"] == "chat":
            assert len(r["turns"]) == 2
        else:
            assert r["prompt"].strip()
        assert 0 < r["prompt_tokens"] <= 1800


def test_suite_counts(suite):
    counts = {t: sum(r["task"] == t for r in suite) for t in TASKS}
    assert counts == {"chat": 80, "code": 40, "summarization": 30, "qa": 30, "code_edit": 20}
    dev = sum(r["split"] == "dev" for r in suite)
    assert 0.15 < dev / len(suite) < 0.35


def test_load_suite_filters():
    dev_code = load_suite(tasks="code", split="dev")
    assert dev_code and all(r["task"] == "code" and r["split"] == "dev" for r in dev_code)
    two = load_suite(tasks=["qa", "summarization"], limit=3)
    assert [r["task"] for r in two].count("qa") == 3
    assert [r["task"] for r in two].count("summarization") == 3
    assert len(load_suite(limit=1)) == len(TASKS)
    assert load_suite(limit=0) == []
    with pytest.raises(ValueError, match="unknown task"):
        load_suite(tasks=["poetry"])
    with pytest.raises(ValueError, match="unknown split"):
        load_suite(split="train")
    with pytest.raises(ValueError, match="limit"):
        load_suite(limit=-1)


# ----------------------------------------------------------------------------- Spec-Bench question files

Q = {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Make it shorter."]}


def test_specbench_questions_load_and_are_told_from_prompt_files(tmp_path):
    from bench.specbench import is_question_file, load_questions

    p = write(tmp_path, [Q, "", {"question_id": "rag-7", "category": "rag", "turns": ["Answer."], "reference": "x"}],
              name="question.jsonl")
    assert is_question_file(p)
    assert load_questions(p) == [
        {"id": "81", "question_id": 81, "task": "writing", "turns": ["Write a poem.", "Make it shorter."]},
        {"id": "rag-7", "question_id": "rag-7", "task": "rag", "turns": ["Answer."]}]
    assert not is_question_file(write(tmp_path, [GOOD]))
    assert not is_question_file(write(tmp_path, ["{not json"], name="broken.jsonl"))


SPEC_BAD = [
    ({"category": "qa", "turns": ["a"]}, "missing field 'question_id'"),
    ({"question_id": 2, "turns": ["a"]}, "missing field 'category'"),
    ({"question_id": 2, "category": "qa"}, "missing field 'turns'"),
    ({"question_id": 2, "category": "qa", "turns": "a"}, "'turns' must be a list of strings, not str"),
    ({"question_id": 2, "category": "qa", "turns": []}, "empty 'turns' list"),
    ({"question_id": 2, "category": "qa", "turns": ["a", 3]}, "turns[1] must be a string, not int"),
    ({"question_id": 2, "category": "qa", "turns": ["a", " "]}, "empty turns[1]"),
    ({"question_id": 2, "category": "", "turns": ["a"]}, "empty 'category'"),
    ({"question_id": True, "category": "qa", "turns": ["a"]}, "'question_id' must be an int or a non-empty string"),
    ({"question_id": 81, "category": "qa", "turns": ["a"]}, "duplicate question_id 81 (first on line 1)"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"question_id": 2,', "invalid JSON"),
]


@pytest.mark.parametrize("bad,expected", SPEC_BAD, ids=[e for _, e in SPEC_BAD])
def test_malformed_specbench_line_names_line_and_field(tmp_path, bad, expected):
    from bench.specbench import load_questions

    p = write(tmp_path, [Q, "", bad], name="question.jsonl")
    with pytest.raises(ValueError) as info:
        load_questions(p)
    msg = str(info.value)
    assert str(p) in msg and "line 3:" in msg and expected in msg, msg


def test_specbench_empty_file_and_bad_utf8(tmp_path):
    from bench.specbench import load_questions

    with pytest.raises(ValueError, match="empty file"):
        load_questions(write(tmp_path, [""], name="empty.jsonl"))
    p = tmp_path / "bad.jsonl"
    p.write_bytes(json.dumps(Q).encode() + b'\n{"question_id": 2, "category": "\xff", "turns": ["a"]}\n')
    with pytest.raises(ValueError, match=r"line 2: not valid UTF-8"):
        load_questions(p)


@pytest.mark.parametrize("name", ["step_cost_reference.json", "step_cost_steep.json"])
def test_reference_step_cost_curve_loads(name):
    """bench/data's curves (step_cost_reference.json: --step-cost's pinned curve;
    step_cost_steep.json: the machine's steep state, for --emulate-cost) are usable curves:
    the measured grid, non-decreasing, with its long-context part and where it came from."""
    import json

    from models.cost import GRID, LONG_GRID, load_step_cost

    path = SUITE_PATH.parent / name
    cost = load_step_cost(path)
    assert cost.tokens == list(GRID) and cost.long_tokens == list(LONG_GRID) and cost.long_context > cost.context
    assert cost([16]) > cost([1]) > 0 and cost([1], [2000]) > cost([1])
    assert "2026-11-25" in json.loads(path.read_text())["origin"]
    if name == "step_cost_steep.json":  # steeper than the reference from 4 step tokens on
        ref = load_step_cost(SUITE_PATH.parent / "step_cost_reference.json")
        assert all(cost.relative(t) > ref.relative(t) for t in (4, 8, 16, 64))
