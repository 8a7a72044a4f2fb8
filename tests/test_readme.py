"""The README's Python examples run as written (with fewer new tokens)."""

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_experiment_example_runs(smol):
    code = python_blocks()[0]
    assert "make_proposer" in code and "max_new_tokens=128" in code
    env: dict = {"print": lambda *a, **k: None}
    exec(code.replace("max_new_tokens=128", "max_new_tokens=6"), env)
    assert len(env["out"]) == 2 and all(len(r.output_ids) == 6 for r in env["out"])


def test_new_method_example_runs():
    from decoding import generate
    from helpers import ours_from_hf, tiny_hf_model

    env: dict = {}
    exec(python_blocks()[1], env)
    model = ours_from_hf(tiny_hf_model("llama", seed=3)).model
    prompts = [[7, 7, 7, 7, 8, 8], [5, 6, 7]]
    ref = [generate(model, [p], max_new_tokens=12, eos_token_ids=())[0].output_ids for p in prompts]
    res = generate(model, prompts, env["RepeatLast"](), max_new_tokens=12, eos_token_ids=())
    assert [r.output_ids for r in res] == ref
    assert res[0].stats.forwards < 11  # the constant run is drafted right
