"""Spec-Bench's file formats: question files in, answer files out.

A Spec-Bench question file is JSONL, one conversation per line::

    {"question_id": 81, "category": "writing", "turns": ["first user turn", "second user turn"]}

``question_id`` (an int or a non-empty string, unique), ``category`` (a non-empty string;
the benchmark's task) and ``turns`` (a non-empty list of non-empty strings) are required;
other fields (e.g. ``reference``) are ignored. :func:`is_question_file` tells such a file
from the benchmark's own prompt format (``bench/data/suite.py``) by its first record.

An answers file (one per method) has one line per conversation in Spec-Bench's layout:
``question_id``, ``category``, ``answer_id``, ``model_id``, ``tstamp`` and
``choices = [{"index": 0, "turns": [text per turn], "new_tokens": [...], "decoding_steps":
[...], "wall_time": [...], "accept_lengths": [...]}]``; see :func:`answer_records`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from bench.data.suite import _check_nonempty_str, _fail


def is_question_file(path: str | Path) -> bool:
    """True when the first non-blank line is a JSON object with ``question_id`` (Spec-Bench's
    layout). Unreadable or odd first lines say False: the prompt-file loader then names the
    problem."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                try:
                    obj = json.loads(line.lstrip("\ufeff"))
                except json.JSONDecodeError:
                    return False
                return isinstance(obj, dict) and "question_id" in obj
    return False


def load_questions(path: str | Path) -> list[dict]:
    """Records ``{"id", "question_id", "task", "turns"}`` of a Spec-Bench question file, in
    file order. A malformed line raises ``ValueError`` naming the file, the 1-based line and
    the field."""
    path = Path(path)
    out, seen = [], {}
    for lineno, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            _fail(path, lineno, f"not valid UTF-8 ({e.reason})")
        if lineno == 1:
            line = line.lstrip("\ufeff")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            _fail(path, lineno, f"invalid JSON: {e.msg} (column {e.colno})")
        if not isinstance(obj, dict):
            _fail(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
        for key in ("question_id", "category", "turns"):
            if key not in obj:
                _fail(path, lineno, f"missing field '{key}' (a Spec-Bench question needs question_id, "
                                    "category and turns)")
        qid = obj["question_id"]
        if isinstance(qid, bool) or not isinstance(qid, (int, str)) or (isinstance(qid, str) and not qid.strip()):
            _fail(path, lineno, f"'question_id' must be an int or a non-empty string, got {qid!r}")
        category = _check_nonempty_str(path, lineno, obj["category"], "'category'")
        turns = obj["turns"]
        if not isinstance(turns, list):
            _fail(path, lineno, f"'turns' must be a list of strings, not {type(turns).__name__}")
        if not turns:
            _fail(path, lineno, "empty 'turns' list")
        for i, t in enumerate(turns):
            _check_nonempty_str(path, lineno, t, f"turns[{i}]")
        rid = str(qid)
        if rid in seen:
            _fail(path, lineno, f"duplicate question_id {qid!r} (first on line {seen[rid]})")
        seen[rid] = lineno
        out.append({"id": rid, "question_id": qid, "task": category, "turns": list(turns)})
    if not out:
        _fail(path, None, "empty file: no questions found")
    return out


def answer_records(results: list[dict], model_id: str) -> dict[str, list[dict]]:
    """Per method, one Spec-Bench answer per conversation from the benchmark's records (those
    of ``bench/run.py``: ``conversation``, ``question_id``, ``turn``, ``text``, ``new_tokens``,
    ``forwards``, ``time_s``, ``accept_lengths``). Turns are in order; ``accept_lengths`` is
    the per-step list of every turn, concatenated (Spec-Bench's habit); ``decoding_steps``
    says how many steps each turn took, so the list can be split again."""
    convs: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        convs.setdefault((r["method"], r["conversation"]), []).append(r)
    out: dict[str, list[dict]] = {}
    for (method, conv), recs in convs.items():
        recs.sort(key=lambda r: r["turn"])
        steps = [r.get("accept_lengths") or [] for r in recs]
        out.setdefault(method, []).append({
            "question_id": recs[0]["question_id"], "category": recs[0]["task"],
            "answer_id": f"{conv}-{method}", "model_id": f"{model_id}-{method}",
            "choices": [{"index": 0, "turns": [r["text"] for r in recs],
                         "new_tokens": [r["new_tokens"] for r in recs],
                         "decoding_steps": [len(s) for s in steps],
                         "wall_time": [r["time_s"] for r in recs],
                         "accept_lengths": [n for s in steps for n in s]}],
            "tstamp": time.time(),
        })
    return out


def write_answers(out_dir: Path, results: list[dict], model_id: str) -> list[Path]:
    """``out_dir/answers_<method>.jsonl`` for every method; returns the paths."""
    paths = []
    for method, answers in answer_records(results, model_id).items():
        p = out_dir / f"answers_{method}.jsonl"
        p.write_text("".join(json.dumps(a) + "\n" for a in answers))
        paths.append(p)
    return paths
