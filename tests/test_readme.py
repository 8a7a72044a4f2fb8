"""The README's Python examples run as written (with fewer new tokens), and every command-line
flag has help text and appears in the README."""

import argparse
import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def block(marker: str) -> str:
    """The README's one Python block containing ``marker``."""
    found = [b for b in re.findall(r"```python\n(.*?)```", README, flags=re.S) if marker in b]
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


def parsers() -> dict[str, argparse.ArgumentParser]:
    import bench.model_speed
    import bench.run
    import decoding.cli

    out = {}
    for name, mod in [("python -m decoding", decoding.cli), ("bench/run.py", bench.run),
                      ("bench/model_speed.py", bench.model_speed)]:
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
        out[name] = captured[0]
    return out


def test_every_flag_has_help_and_is_in_the_readme():
    missing = []
    for name, p in parsers().items():
        for a in p._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            flag = a.option_strings[0] if a.option_strings else None
            if not a.help:
                missing.append(f"{name} {flag or a.dest}: no help text")
            if flag and not re.search(re.escape(flag) + r"(?![\w-])", README):
                missing.append(f"{name} {flag}: not in the README")
    assert not missing, "\n".join(missing)
