"""The documentation's Python examples run as written (with fewer new tokens), and every
command-line flag has help text and appears in the document that describes its command."""

import argparse
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CONFIG = (ROOT / "docs" / "CONFIG.md").read_text()
BENCH = (ROOT / "bench" / "README.md").read_text()
DOCS = {"README.md": README, "docs/CONFIG.md": CONFIG, "bench/README.md": BENCH,
        "docs/DESIGN.md": (ROOT / "docs" / "DESIGN.md").read_text()}


def block(marker: str) -> str:
    """The one Python block of the documents containing ``marker``."""
    found = [b for text in DOCS.values() for b in re.findall(r"```python\n(.*?)```", text, flags=re.S)
             if marker in b]
    assert len(found) == 1, f"{len(found)} python blocks contain {marker!r}"
    return found[0]


def test_experiment_example_runs(smol):
    code = block("LookaheadConfig(window=7")
    assert "make_proposer" in code and "max_new_tokens=128" in code
    env: dict = {"print": lambda *a, **k: None}
    exec(code.replace("max_new_tokens=128", "max_new_tokens=6"), env)
    assert len(env["out"]) == 2 and all(len(r.output_ids) == 6 for r in env["out"])


def test_new_method_example_runs():
    from decoding import generate
    from helpers import ours_from_hf, tiny_hf_model

    env: dict = {}
    exec(block("class RepeatLast"), env)
    model = ours_from_hf(tiny_hf_model("llama", seed=3)).model
    prompts = [[7, 7, 7, 7, 8, 8], [5, 6, 7]]
    ref = [generate(model, [p], max_new_tokens=12, eos_token_ids=())[0].output_ids for p in prompts]
    res = generate(model, prompts, env["RepeatLast"](), max_new_tokens=12, eos_token_ids=())
    assert [r.output_ids for r in res] == ref
    assert res[0].stats.forwards < 11  # the constant run is drafted right


def test_text_example_runs(smol):
    code = block("TextGenerator.load()")
    env: dict = {"print": lambda *a, **k: None}
    exec(code.replace("max_new_tokens=32", "max_new_tokens=6"), env)
    assert len(env["out"]) == 2 and all(r.text for r in env["out"])


def test_bring_your_own_model_example_runs():
    env: dict = {}
    exec(block("from_hf(hf)"), env)
    assert len(env["out"][0].output_ids) == 8


def parsers() -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """Each command's parser and the document that must describe its flags."""
    import bench.model_speed
    import bench.profile_step
    import bench.run
    import decoding.cli

    out = {}
    for name, mod, doc in [("python -m decoding", decoding.cli, "docs/CONFIG.md"),
                           ("bench/run.py", bench.run, "bench/README.md"),
                           ("bench/model_speed.py", bench.model_speed, "bench/README.md"),
                           ("bench/profile_step.py", bench.profile_step, "bench/README.md")]:
        captured = []
        real = argparse.ArgumentParser.parse_args

        def grab(self, *a, **k):
            captured.append(self)
            raise SystemExit(0)

        argparse.ArgumentParser.parse_args = grab
        try:
            with pytest.raises(SystemExit):
                mod.parse_args([])
        finally:
            argparse.ArgumentParser.parse_args = real
        out[name] = (captured[0], doc)
    return out


def test_every_flag_has_help_and_is_documented():
    missing = []
    for name, (p, doc) in parsers().items():
        for a in p._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            flag = a.option_strings[0] if a.option_strings else None
            if not a.help:
                missing.append(f"{name} {flag or a.dest}: no help text")
            if flag and not re.search(re.escape(flag) + r"(?![\w-])", DOCS[doc]):
                missing.append(f"{name} {flag}: not in {doc}")
    assert not missing, "\n".join(missing)


def test_readme_is_short():
    assert len(README.splitlines()) <= 300, "the README is a front page: details go to docs/ and bench/"


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_relative_links_of_the_documents_resolve():
    bad = []
    for name, text in DOCS.items():
        base = (ROOT / name).parent
        for target, anchor in set(re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text)):
            if target.startswith("http"):
                continue
            path = (base / target) if target else ROOT / name
            if not path.exists():
                bad.append(f"{name} links {target}, which does not exist")
            elif anchor and path.suffix == ".md":
                heads = {slug(h) for h in re.findall(r"^#+ (.*)$", path.read_text(), flags=re.M)}
                if anchor not in heads:
                    bad.append(f"{name} links {target}#{anchor}: no such heading")
    assert not bad, "\n".join(bad)
