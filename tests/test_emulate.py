"""models.cost.Emulation: another machine's step-cost curve played on this one by padding
forwards (fake clock and sleep: nothing here is timed), the runner honouring it, the cache
key, and bench/run.py --emulate-cost."""

import json
import re

import pytest
import torch

from bench.model_speed import SHAPES, random_model
from kernels.backend import get_backend
from models.config import ModelConfig
from models.cost import Emulation, StepCost, _key, emulate_step_cost, load_step_cost, save_step_cost
from models.runner import ModelRunner, StepInput

CURVE = dict(tokens=[1, 16, 64], ms=[10.0, 20.0, 80.0], per_seq_ms=1.0, context=256)


class FakeTime:
    """clock() returns the next of ``ticks`` (seconds); sleep() records what it was asked."""

    def __init__(self, *ticks):
        self.ticks, self.slept = list(ticks), []

    def clock(self) -> float:
        return self.ticks.pop(0)

    def sleep(self, s: float) -> None:
        self.slept.append(s)


def emulation(scale=0.5, ticks=(0.0, 0.002), **curve):
    t = FakeTime(*ticks)
    return Emulation(StepCost(**{**CURVE, **curve}), scale, "test", sleep=t.sleep, clock=t.clock), t


def test_pad_sleeps_the_rest_of_the_scaled_curve():
    em, t = emulation()
    # 4 tokens: 10 + 10 * 3 / 15 = 12 ms on the curve, x 0.5 = 6 ms; 2 ms passed: 4 ms left
    assert em.pad(t.clock(), [4]) == pytest.approx(4.0)
    assert t.slept == [pytest.approx(0.004)]
    assert (em.steps, em.padded, em.short_steps, em.large_steps) == (1, 1, 0, 0)
    assert em.padded_ms == pytest.approx(4.0)


def test_two_sequences_cost_their_total_plus_the_per_sequence_cost():
    em, t = emulation(scale=1.0, ticks=(0.0, 0.0))
    # 3 + 1 tokens: curve(4) = 12, + 1 ms for the second sequence
    assert em.target_ms([3, 1]) == pytest.approx(13.0)
    assert em.pad(t.clock(), [3, 1]) == pytest.approx(13.0)


def test_committed_lengths_add_the_long_curve_slope():
    em, _ = emulation(scale=1.0, long_context=1280, long_tokens=[1, 64], long_ms=[30.0, 100.0])
    # one token over 768 more committed tokens than measured: (30 - 10) * 768 / 1024 = 15 ms more
    assert em.target_ms([1], [256 + 768]) == pytest.approx(10.0 + 15.0)
    assert em.target_ms([1], [256]) == pytest.approx(10.0)


def test_steps_above_the_curve_and_slower_steps_are_not_padded():
    em, t = emulation(ticks=(0.0, 0.0, 1.0))  # a step above the curve reads no clock
    assert em.pad(t.clock(), [65]) == 0.0  # above 64 tokens: a prefill runs as it is
    assert em.pad(t.clock(), [1]) == 0.0  # took 1 s already
    assert t.slept == [] and (em.steps, em.padded, em.short_steps, em.large_steps) == (2, 0, 1, 1)
    assert "2 forwards: 0 padded" in em.stats() and "1 slower than emulated, 1 above 64 tokens" in em.stats()
    em.reset()
    assert (em.steps, em.padded, em.short_steps, em.large_steps, em.padded_ms) == (0, 0, 0, 0, 0.0)


def test_scale_must_be_positive():
    with pytest.raises(ValueError, match="scale must be > 0"):
        Emulation(StepCost(**CURVE), 0.0)


@pytest.fixture(scope="module")
def tiny():
    return random_model(ModelConfig(**SHAPES["tiny"]), get_backend("torch"), torch.float32, torch.device("cpu"))


def test_emulate_step_cost_sets_and_clears_the_models_emulation(tiny):
    em = emulate_step_cost(tiny, StepCost(**CURVE), source="f.json")
    try:
        assert tiny.emulated_cost is em and em.scale == 1.0
        described = em.describe()
        assert described.startswith("f.json: forwards of at most 64 step tokens") and "1 token 10.0 ms" in described
        assert "16 tokens 20.0 (2.00x)" in em.describe()
        em = emulate_step_cost(tiny, StepCost(**CURVE), scale=2.0, source="f.json")
        assert em.describe().startswith("f.json x 2: ") and "1 token 20.0 ms" in em.describe()
    finally:
        assert emulate_step_cost(tiny, None) is None
    assert tiny.emulated_cost is None


def test_the_runner_pads_each_forward_with_its_step_tokens_and_committed_lengths(tiny):
    """Both sequences' step tokens and committed lengths reach the emulation; the logits are
    those of the plain forward."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, tiny.cfg.vocab_size, (n,), generator=gen).tolist() for n in (20, 7)]
    runner = ModelRunner(tiny, cache_tokens=256, block_size=16)
    for s, p in enumerate(prompts):
        runner.add_sequence(s)
        runner.step([StepInput(s, p)])
        runner.commit({s: list(range(len(p)))})
    step = [StepInput(0, [5, 6, 7], parents=[-1, 0, 0]), StepInput(1, [9])]
    plain = runner.step(step)
    seen = []

    class Spy(Emulation):
        def pad(self, start, step_tokens, contexts=None):
            seen.append((step_tokens, contexts))
            return super().pad(start, step_tokens, contexts)

    t = FakeTime(0.0, 0.001)
    tiny.emulated_cost = Spy(StepCost(**CURVE), 1.0, sleep=t.sleep, clock=t.clock)
    try:
        padded = runner.step(step)
    finally:
        tiny.emulated_cost = None
    assert seen == [([3, 1], [20, 7])]
    assert t.slept == [pytest.approx((12.0 + 1.0 - 1.0) / 1e3)]  # curve(4) + 1 sequence, 1 ms gone
    for a, b in zip(plain, padded):
        torch.testing.assert_close(a, b)


def test_the_step_cost_cache_key_records_the_emulated_curve(tiny):
    plain = _key(tiny, 256)
    emulate_step_cost(tiny, StepCost(**CURVE), scale=1.0)
    try:
        one = _key(tiny, 256)
        emulate_step_cost(tiny, StepCost(**CURVE), scale=3.0)
        scaled = _key(tiny, 256)
        emulate_step_cost(tiny, StepCost(**{**CURVE, "ms": [10.0, 30.0, 80.0]}), scale=1.0)
        other = _key(tiny, 256)
    finally:
        emulate_step_cost(tiny, None)
    assert plain["emulated"] is None and len({one["emulated"], scaled["emulated"], other["emulated"]}) == 3
    assert {k: v for k, v in plain.items() if k != "emulated"} == {k: v for k, v in one.items() if k != "emulated"}


def test_bench_refuses_emulation_beside_transformers_and_a_bad_file(tmp_path, capsys):
    from bench.run import parse_args

    good = tmp_path / "c.json"
    save_step_cost(StepCost(**CURVE), good)
    with pytest.raises(SystemExit):
        parse_args(["--emulate-cost", str(good), "--compare-hf"])
    assert "--emulate-cost pads this project's forwards only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--emulate-cost", str(tmp_path / "missing.json")])
    assert f"--emulate-cost {tmp_path / 'missing.json'}: no such file" in capsys.readouterr().err
    args = parse_args(["--emulate-cost", str(good)])
    assert args.emulate_curve == load_step_cost(good)


def test_bench_run_emulated(tmp_path):
    """A run with a curve slower than this machine's: forwards are padded, the outputs stay
    those of ar, and the header says what was emulated and what the emulation did."""
    from bench.run import main

    steep = tmp_path / "steep.json"
    # slower than this machine even when other work shares its cores (a forward slower than the
    # curve is not padded, and the test needs some padded)
    curve = StepCost([1, 2, 64], [150.0, 300.0, 3000.0], 0.0, 256)
    save_step_cost(curve, steep)
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"prompt": "Count from one to twenty: one, two, three,", "task": "mine"}) + "\n")
    out = tmp_path / "o"
    assert main(["--prompts", str(q), "--methods", "lookahead", "--no-plan", "--max-new-tokens", "8",
                 "--emulate-cost", str(steep), "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    head = data["header"]["emulated step cost"]
    assert head.startswith(f"{steep}: forwards of at most 64") and f"({curve.relative(16):.2f}x)" in head
    forwards, padded = map(int, re.search(r"(\d+) forwards: (\d+) padded", head).groups())
    assert forwards >= 2 and padded >= 1
    assert all(r["identical_to_ar"] for r in data["records"] if r["method"] != "ar")


def test_the_step_cost_cache_key_records_a_kv_cache_of_another_dtype(tiny):
    """A curve measured over an fp16 cache is not the one over an fp32 cache (the attention
    reads half the bytes); the key of a cache in the model's dtype keeps its old form."""
    plain = _key(tiny, 256)
    tiny.kv_dtype = torch.float16
    try:
        half = _key(tiny, 256)
    finally:
        tiny.kv_dtype = None
    assert "kv" not in plain and half == {**plain, "kv": "torch.float16"}
