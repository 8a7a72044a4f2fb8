"""Every input check of the three front doors, in one place: ``python -m decoding``,
``bench/run.py`` and the Python API (``TextGenerator.generate``, ``SamplingParams``, the
method configs).

A check gets the value and the name its caller knows it by: a flag on the command line
(``--temperature``, see ``flag``), an argument in Python (``temperature``). The message is
otherwise the same: the name, what it got and what it accepts. Every check raises
``InputError`` (a ValueError), and the front doors run them before any model loads wherever
the value is known then. Nothing here needs a model: the prompt-file readers use it too.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from pathlib import Path
from typing import Callable, NoReturn, Optional

ROLES = ("system", "user", "assistant")
MIN_TEMPERATURE = 1e-6  # below it 1 / temperature overflows float32 logits (and it is greedy in all but name)
SEED_BITS = 44  # a sequence's generator is seeded with seed * 1_000_003 + index, which must stay below 2**64


class InputError(ValueError):
    """A bad input: the message names the flag or argument, what it got and what it accepts."""


def flag(arg: str) -> str:
    """An argument's name as a command-line flag: ``top_p`` -> ``--top-p``."""
    return "--" + arg.replace("_", "-")


def arg(name: str) -> str:
    """An argument's name as it is in Python (the API's naming)."""
    return name


def fail(name: str, got, accepts: str) -> NoReturn:
    raise InputError(f"{name} must be {accepts}, got {got!r}")


# ---- numbers -------------------------------------------------------------------------------

def real(value, name: str, accepts: str, ok: Callable[[float], bool] = lambda v: True) -> float:
    """``value`` as a float: a finite real number (not a bool, not text) for which ``ok`` holds."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or not ok(value):
        fail(name, value, accepts)
    return float(value)


def integer(value, name: str, accepts: str, ok: Callable[[int], bool] = lambda v: True) -> int:
    """``value`` as an int: an integer (not a bool, not a float, not text) for which ``ok`` holds."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not ok(value):
        fail(name, value, accepts)
    return int(value)


def at_least(value, name: str, minimum: int) -> int:
    return integer(value, name, f"an integer >= {minimum}", lambda v: v >= minimum)


def sampling(temperature, top_k, top_p, seed, names: Callable[[str], str] = arg) -> None:
    """SamplingParams' fields (``names``: ``arg`` in Python, ``flag`` on the command line)."""
    real(temperature, names("temperature"), f"0 (greedy) or a finite number >= {MIN_TEMPERATURE:g}",
         lambda t: t == 0 or t >= MIN_TEMPERATURE)
    integer(top_k, names("top_k"), "an integer >= 0 (0 = off)", lambda k: k >= 0)
    real(top_p, names("top_p"), "a number in (0, 1] (1 = off)", lambda p: 0 < p <= 1)
    if seed is not None:
        integer(seed, names("seed"), f"an integer in [0, 2**{SEED_BITS})", lambda s: 0 <= s < 2 ** SEED_BITS)


def lookahead_window(window: int, ngram: int, candidates: int, name: str, candidates_name: str) -> None:
    """A lookahead step sends its window's W * (N - 1) tokens beside up to ``candidates``
    verified ones (and the root); a sequence has room for ``models.runner.STEP_TOKENS`` step
    tokens past its answer."""
    from models.runner import STEP_TOKENS

    sent = window * (ngram - 1)
    if sent + candidates > STEP_TOKENS:
        raise InputError(f"{name}: the window sends W*(N-1) = {window}*{ngram - 1} = {sent} tokens per step beside up "
                         f"to {candidates} candidates ({candidates_name}), more than the {STEP_TOKENS} step tokens "
                         f"a sequence has room for: W*(N-1) must be at most {STEP_TOKENS - candidates}")


# ---- text ----------------------------------------------------------------------------------

_ESCAPES = {"\\": "\\", "n": "\n", "t": "\t"}


def unescape(text: str) -> str:
    r"""``\n`` -> newline, ``\t`` -> tab, ``\\`` -> one backslash; any other backslash stays as
    it is (the command line's ``--stop``, where a shell passes ``"\n"`` as two characters)."""
    return re.sub(r"\\([\\nt])", lambda m: _ESCAPES[m.group(1)], text)


def stop_strings(stop, name: str = "stop") -> list[str]:
    """A string (one stop string, not its characters), a list of them, or None (none)."""
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    try:
        items = list(items)
    except TypeError:
        fail(name, stop, "a non-empty string or a list of non-empty strings")
    if any(not isinstance(s, str) or not s for s in items):
        fail(name, stop, "a non-empty string or a list of non-empty strings")
    return items


def nonempty_text(value, what: str) -> str:
    """A string with something besides white space; the messages the prompt files use."""
    if not isinstance(value, str):
        raise InputError(f"{what} must be a string, not {type(value).__name__}")
    if not value.strip():
        raise InputError(f"empty {what}")
    return value


def messages(value) -> list[dict]:
    """Chat messages: a non-empty list of ``{"role": system|user|assistant, "content": text}``
    with at least one user message. Returns them with those two keys only."""
    if not isinstance(value, list):
        raise InputError(f"'messages' must be a list, not {type(value).__name__}")
    if not value:
        raise InputError("empty 'messages' list")
    clean = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise InputError(f"messages[{i}] must be an object, not {type(m).__name__}")
        for key in ("role", "content"):
            if key not in m:
                raise InputError(f"messages[{i}] is missing field '{key}'")
        role = m["role"]
        if not isinstance(role, str):
            raise InputError(f"messages[{i}].role must be a string, not {type(role).__name__}")
        if role not in ROLES:
            raise InputError(f"messages[{i}] has unknown role {role!r} (expected one of {list(ROLES)})")
        nonempty_text(m["content"], f"messages[{i}].content")
        clean.append({"role": role, "content": m["content"]})
    if not any(m["role"] == "user" for m in clean):
        raise InputError("'messages' has no 'user' message")
    return clean


def prompt(value, name: str = "prompt"):
    """A prompt: a non-empty string or chat messages (see ``messages``)."""
    if isinstance(value, str):
        if not value.strip():
            raise InputError(f"{name} is empty: give the text to answer")
        return value
    if isinstance(value, list):
        try:
            return messages(value)
        except InputError as e:
            raise InputError(f"{name}: {e}") from None
    raise InputError(f"{name} must be a string or a list of chat messages {{'role': ..., 'content': ...}}, "
                     f"got {type(value).__name__}")


def prompts(value, name: str = "prompts") -> tuple[list, bool]:
    """One prompt or a list of them -> (the list, whether it was one)."""
    if isinstance(value, str) or (isinstance(value, list) and value and isinstance(value[0], dict)):
        return [prompt(value, "prompt")], True
    if not isinstance(value, (list, tuple)):
        raise InputError(f"{name} must be a prompt (a string or chat messages) or a list of prompts, "
                         f"got {type(value).__name__}")
    if not value:
        raise InputError(f"{name} is empty: give at least one prompt")
    return [prompt(p, f"prompt {i}") for i, p in enumerate(value)], False


# ---- files and folders ---------------------------------------------------------------------

def input_file(path, name: str) -> Path:
    """An existing, readable file (not a folder)."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise InputError(f"{name} {path}: is a folder, not a file")
    if not p.exists():
        raise InputError(f"{name} {path}: no such file")
    if not os.access(p, os.R_OK):
        raise InputError(f"{name} {path}: cannot be read (permission denied)")
    return p


def output_dir(path, name: str) -> Path:
    """A folder to write into: an existing writable one, or one that can be made (every part
    of its path that exists is a writable folder)."""
    p = Path(path).expanduser()
    if p.is_symlink() and not p.exists():
        raise InputError(f"{name} {path}: is a broken link (it points to {os.readlink(p)}, which does not exist)")
    if p.exists() and not p.is_dir():
        raise InputError(f"{name} {path}: is a file, not a folder (give a folder; it is made if missing)")
    up = p
    while not up.exists():
        up = up.parent
    if not up.is_dir():
        raise InputError(f"{name} {path}: {up} is a file, so no folder can be made under it")
    if not os.access(up, os.W_OK | os.X_OK):
        raise InputError(f"{name} {path}: {up} is not writable")
    return p


def model_path(model: Optional[str], name: str) -> Path:
    """Where ``model`` (a name, a .gguf file or an HF folder) is, without loading it."""
    from models.loader import resolve_model_path

    if model is not None and (not isinstance(model, str) or not model.strip()):
        fail(name, model, "a model name, a .gguf file or a Hugging Face folder")
    try:
        return resolve_model_path(model)
    except ValueError as e:
        raise InputError(f"{name} {model}: {e}") from None


# ---- models --------------------------------------------------------------------------------

def same_tokenizer(target, draft, target_name: str = "the target", draft_name: str = "the draft model") -> None:
    """The draft model's tokenizer must map every token to the same id as the target's: the
    vocabularies themselves are compared (token -> id), not their sizes."""
    a, b = dict(target.get_vocab()), dict(draft.get_vocab())
    if a == b:
        return
    moved = sorted(t for t in a.keys() & b.keys() if a[t] != b[t])
    missing, extra = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
    parts = []
    if moved:
        t = moved[0]
        parts.append(f"{len(moved)} tokens have other ids (e.g. {t!r}: {b[t]} there, {a[t]} in the target)")
    if missing:
        parts.append(f"{len(missing)} of the target's {len(a)} tokens are missing (e.g. {missing[0]!r})")
    if extra:
        parts.append(f"{len(extra)} tokens are not the target's (e.g. {extra[0]!r})")
    raise InputError(f"{draft_name} has another tokenizer than {target_name}: {'; '.join(parts)}. A draft model "
                     f"must share the target's tokenizer (the same token -> id map)")


def cache_full(e, flags: bool = True) -> str:
    """What a KV cache that ran out mid-generation (``models.kv_cache.KVCacheFull``) means for
    the user: the knobs they can change, on the command line (``flags``) or in Python."""
    what = (f"a step needed {e.needed} more blocks of {e.block_size} tokens, {e.free} of {e.num_blocks} were free"
            if hasattr(e, "needed") else str(e))
    if flags:
        knobs = "a smaller --lookahead W or N, or fewer --max-new-tokens (--batch-size in the benchmark)"
    else:
        knobs = ("smaller steps (a method config's window / max_verify / max_nodes), fewer max_new_tokens, or a "
                 "runner= with a larger cache (ModelRunner(model, cache_tokens=...))")
    return f"a decoding step did not fit the KV cache reserved for the run ({what}); send smaller steps: {knobs}"
