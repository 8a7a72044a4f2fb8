"""Load the built-in benchmark prompt suite, or a user's own prompt file.

* :func:`load_suite` reads ``suite.jsonl`` beside this module (built by ``make_suite.py``;
  schema in ``README.md``).
* :func:`load_prompt_file` reads a user's JSONL file with one prompt per line, either
  ``{"task": str, "prompt": str}`` (one user message) or
  ``{"task": str, "messages": [{"role": ..., "content": ...}, ...]}``, optionally with ``"id"``.
  A malformed file raises ``ValueError`` naming the file, the 1-based line and the problem.

Neither needs a tokenizer or a model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn

from decoding import inputs

SUITE_PATH = Path(__file__).resolve().parent / "suite.jsonl"
TASKS = ("chat", "code", "summarization", "qa", "code_edit")
SPLITS = ("dev", "test")
ROLES = inputs.ROLES


def load_suite(
    tasks: str | Iterable[str] | None = None,
    split: str | None = None,
    limit: int | None = None,
    path: str | Path | None = None,
) -> list[dict]:
    """Records of the built-in suite, in file order.

    tasks: one task name or several (default: all of ``TASKS``).
    split: ``"dev"`` (for tuning hyperparameters), ``"test"`` (for reporting) or None for both.
    limit: at most this many records *per task* (the first ones in file order, after the
        split filter), so that a small limit still covers every requested task.
    path: another suite file with the same schema (default: ``suite.jsonl`` beside this module).
    """
    if isinstance(tasks, str):
        tasks = [tasks]
    wanted = list(TASKS) if tasks is None else list(tasks)
    unknown = [t for t in wanted if t not in TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; known tasks: {list(TASKS)}")
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {list(SPLITS)} or None")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, not {limit!r}")
    suite_path = Path(path) if path is not None else SUITE_PATH
    if not suite_path.exists():
        raise FileNotFoundError(f"{suite_path} not found; build it with `python bench/data/make_suite.py`")
    taken = {t: 0 for t in wanted}
    out = []
    with open(suite_path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{suite_path}, line {lineno}: invalid JSON ({e.msg})") from None
            task = rec.get("task")
            if task not in taken or (split is not None and rec.get("split") != split):
                continue
            if limit is not None and taken[task] >= limit:
                continue
            taken[task] += 1
            out.append(rec)
    return out


def user_turns(record: dict) -> list[str]:
    """The user messages of a suite record, in order (chat records have two turns)."""
    if record.get("task") == "chat":
        return list(record["turns"])
    return [record["prompt"]]


def _fail(path: Path, lineno: int | None, what: str) -> NoReturn:
    where = f"{path}, line {lineno}" if lineno is not None else f"{path}"
    raise ValueError(f"{where}: {what}")


def _check_nonempty_str(path: Path, lineno: int, value, what: str) -> str:
    try:
        return inputs.nonempty_text(value, what)
    except inputs.InputError as e:
        _fail(path, lineno, str(e))


def load_prompt_file(path: str | Path) -> list[dict]:
    """Read a user's prompt file (JSONL, UTF-8) into a list of records.

    Each non-blank line is a JSON object with a non-empty string ``"task"`` and exactly one of

    * ``"prompt"``: a non-empty string, the user message;
    * ``"messages"``: a non-empty list of ``{"role": "system"|"user"|"assistant",
      "content": <non-empty string>}`` with at least one ``"user"`` message.

    ``"id"`` (a non-empty string or an int) is optional and must be unique; it defaults to
    ``"<file stem>-<line number>"``. Other fields are kept as they are. Blank lines are skipped.

    Every returned record has ``"id"``, ``"task"`` and ``"messages"`` (and ``"prompt"`` when the
    line gave one). Raises ``ValueError`` naming the file and the 1-based line number.
    """
    path = Path(path)
    raw = path.read_bytes()
    out: list[dict] = []
    seen_ids: dict[str, int] = {}
    for lineno, bline in enumerate(raw.split(b"\n"), 1):
        try:
            line = bline.decode("utf-8")
        except UnicodeDecodeError as e:
            _fail(path, lineno, f"not valid UTF-8 ({e.reason})")
        if lineno == 1 and line.startswith("\ufeff"):
            line = line[1:]
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            _fail(path, lineno, f"invalid JSON: {e.msg} (column {e.colno})")
        if not isinstance(obj, dict):
            _fail(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
        if "task" not in obj:
            _fail(path, lineno, "missing field 'task'")
        _check_nonempty_str(path, lineno, obj["task"], "'task'")

        has_prompt, has_messages = "prompt" in obj, "messages" in obj
        if has_prompt == has_messages:
            what = "both 'prompt' and 'messages'" if has_prompt else "missing field 'prompt' or 'messages'"
            _fail(path, lineno, what + " (give exactly one)")
        rec = dict(obj)
        if has_prompt:
            prompt = _check_nonempty_str(path, lineno, obj["prompt"], "'prompt'")
            rec["messages"] = [{"role": "user", "content": prompt}]
        else:
            try:  # the checks (and messages) of every front door's chat messages
                rec["messages"] = inputs.messages(obj["messages"])
            except inputs.InputError as e:
                _fail(path, lineno, str(e))

        if "id" in obj:
            rid = obj["id"]
            if isinstance(rid, bool) or not isinstance(rid, (str, int)):
                _fail(path, lineno, f"'id' must be a string or an int, not {type(rid).__name__}")
            rid = str(rid)
            if not rid.strip():
                _fail(path, lineno, "empty 'id'")
        else:
            rid = f"{path.stem}-{lineno}"
        if rid in seen_ids:
            _fail(path, lineno, f"duplicate id {rid!r} (first on line {seen_ids[rid]})")
        seen_ids[rid] = lineno
        rec["id"] = rid
        out.append(rec)
    if not out:
        _fail(path, None, "empty file: no prompts found")
    return out
