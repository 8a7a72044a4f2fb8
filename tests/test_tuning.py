"""Matrix product forms (models/linear.py), their tuning cache (models/tune.py) and the step
cost model (models/cost.py)."""

import json
import warnings
from dataclasses import asdict, fields

import pytest
import torch
import torch.nn.functional as F

from helpers import ours_from_hf, tiny_hf_model
from kernels import skinny
from models.cost import StepCost, step_cost
from models.linear import BUCKETS, ProductPlan, bucket, pack, product
from models.tune import tune_model

FORMS = (["linear", "wxt"] + (["packed"] if torch.backends.mkldnn.is_available() else [])
         + (["skinny"] if skinny.available() else []))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("bias", [False, True])
def test_every_form_is_the_product(form, bias):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(37, 29, generator=g)
    b = torch.randn(37, generator=g) if bias else None
    plan = ProductPlan([form] * len(BUCKETS), pack(w) if form == "packed" else None)
    with torch.inference_mode():
        for m in list(range(1, 18)) + [31, 64, 70]:
            x = torch.randn(m, 29, generator=g)
            y = product(x, w, b, plan)
            assert y.shape == (m, 37) and y.is_contiguous()
            torch.testing.assert_close(y, F.linear(x, w, b), atol=1e-5, rtol=1e-5)


def test_dispatch_follows_the_table():
    w, x = torch.randn(8, 4), torch.randn(3, 4)
    table = ["linear"] * len(BUCKETS)
    table[bucket(3)] = "no-such-form"
    with pytest.raises(ValueError, match="no-such-form"):
        product(x, w, None, ProductPlan(table))
    product(torch.randn(1, 4), w, None, ProductPlan(table))  # another bucket: fine
    assert [bucket(m) for m in (1, 2, 3, 5, 64, 65, 256, 1000)] == [0, 1, 2, 4, 11, 12, 12, 12]



@pytest.fixture
def tiny():
    return ours_from_hf(tiny_hf_model("llama", seed=3)).model


def _timed_forms(monkeypatch):
    """(make, rounds): make(times) is a timer that runs fn and returns times(form, round of that form) for the
    form that fn used; ``rounds`` counts the timed rounds of each form."""
    import models.tune as tune

    forms_seen, rounds = [], {}
    real_product = tune.product

    def spy(x, w, b, plan, form=None):
        forms_seen.append(form)
        return real_product(x, w, b, plan, form)

    monkeypatch.setattr(tune, "product", spy)

    def make(times):
        def timer(fn, reps):
            forms_seen.clear()
            fn()
            form = forms_seen[-1]
            rounds[form] = rounds.get(form, 0) + 1
            return times(form, rounds[form])
        return timer
    return make, rounds


def test_tune_measures_once_then_reads_the_cache(tiny, tmp_path, monkeypatch):
    make, rounds = _timed_forms(monkeypatch)
    timer = make(lambda form, r: 1.0 if form == "wxt" else 2.0)
    seen = rounds  # timed rounds per form
    tables = tune_model(tiny, tmp_path, "off", timer=timer)
    assert seen and all(t == ["wxt"] * len(BUCKETS) for t in tables.values())
    assert tiny.layers[0].wqkv.plan.table == ["wxt"] * len(BUCKETS) and tiny.head_plan is not None
    n = sum(seen.values())
    assert tune_model(tiny, tmp_path, "off", timer=timer) == tables and sum(seen.values()) == n  # from the cache
    files = list((tmp_path / "tune").glob("*.json"))
    assert len(files) == 1
    files[0].write_text("{ not json")
    with pytest.warns(UserWarning, match="unreadable"):
        tune_model(tiny, tmp_path, "off", timer=timer)
    assert sum(seen.values()) > n
    data = json.loads(files[0].read_text())
    data["key"]["device"] = "some other machine"
    files[0].write_text(json.dumps(data))
    n = sum(seen.values())
    with pytest.warns(UserWarning, match="another setup"):
        tune_model(tiny, tmp_path, "off", timer=timer)
    assert sum(seen.values()) > n


def test_tune_slow_spell_does_not_decide(tiny, tmp_path, monkeypatch):
    """The forms of a bucket are timed in interleaved rounds and each keeps its fastest: a slow
    spell over the first rounds of the fastest form (as after a model load) does not hand the
    bucket to another form."""
    make, rounds = _timed_forms(monkeypatch)
    # wxt is the fastest but slow in two of every five rounds; every other form takes 2.0
    timer = make(lambda form, r: (50.0 if r % 5 in (1, 2) else 1.0) if form == "wxt" else 2.0)

    tables = tune_model(tiny, tmp_path, "off", reps=5, timer=timer)
    assert all(t == ["wxt"] * len(BUCKETS) for t in tables.values())
    assert set(rounds.values()) == {5 * len(BUCKETS) * len(tables)}


@pytest.mark.skipif(not skinny.available(), reason=f"skinny kernel: {skinny.unavailable_reason()}")
def test_skinny_form_is_offered_where_it_builds(tiny, tmp_path, monkeypatch):
    """On an x86 CPU in fp32 the hand-written kernel is a candidate even with no memory to
    spare (it reads the weight itself), it wins where it measures fastest, a table measured
    with another build of it is measured again, and it is not a candidate where it is
    unavailable."""
    make, rounds = _timed_forms(monkeypatch)
    tables = tune_model(tiny, tmp_path, "off", timer=make(lambda form, r: 1.0 if form == "skinny" else 2.0))
    assert set(rounds) == {"linear", "wxt", "skinny"}
    assert all(t == ["skinny"] * len(BUCKETS) for t in tables.values())
    assert tiny.layers[0].wqkv.plan.packed is None  # no second copy of the weight
    n = sum(rounds.values())
    tune_model(tiny, tmp_path, "off", timer=make(lambda form, r: 1.0))
    assert sum(rounds.values()) == n  # cached
    monkeypatch.setattr(skinny, "build_tag", lambda: "another build of the kernel")
    tune_model(tiny, tmp_path, "off", timer=make(lambda form, r: 1.0))
    assert sum(rounds.values()) > n  # a table measured with another build is measured again
    rounds.clear()
    monkeypatch.setattr(skinny, "available", lambda: False)
    tables = tune_model(tiny, tmp_path, "off", timer=make(lambda form, r: 1.0 if form == "wxt" else 2.0))
    assert set(rounds) == {"linear", "wxt"} and all(t == ["wxt"] * len(BUCKETS) for t in tables.values())


def test_describe_names_the_forms_per_bucket(tiny, tmp_path, monkeypatch):
    from models.tune import describe

    assert describe(tiny).startswith("untuned")
    make, _ = _timed_forms(monkeypatch)
    tune_model(tiny, tmp_path, "off", timer=make(lambda form, r: 1.0 if form == "wxt" else 2.0))
    line = describe(tiny)
    assert line.startswith("forms by rows") and "1: wxt, 2: wxt" in line and "64: wxt" in line
    monkeypatch.setattr(skinny, "available", lambda: False)
    monkeypatch.setattr(skinny, "unavailable_reason", lambda: "no C compiler found")
    assert describe(tiny).endswith("skinny kernel not offered: no C compiler found")


def test_tuned_model_gives_the_same_logits(tiny, tmp_path):
    from models.runner import ModelRunner, StepInput

    ids = [5, 6, 7, 8, 9, 10, 11]

    def logits():
        runner = ModelRunner(tiny, cache_tokens=64)
        runner.add_sequence(0)
        return runner.step([StepInput(0, ids)])[0]

    before = logits()
    tune_model(tiny, tmp_path, "on")
    torch.testing.assert_close(logits(), before, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="extra_weight_memory"):
        tune_model(tiny, tmp_path, "maybe")


# ---- the step cost model ------------------------------------------------------------------------------
def fake_cost(model, context, reps):
    fake_cost.calls += 1
    return StepCost([1, 2, 4, 8], [10.0, 11.0, 12.0, 20.0], 1.5, context)


def fake_probe(model, context, tokens):
    """Steps timed now that agree with fake_cost's curve."""
    return {t: StepCost([1, 2, 4, 8], [10.0, 11.0, 12.0, 20.0], 1.5, context).curve(t) for t in tokens}


def test_step_cost_interpolates():
    c = StepCost([1, 2, 4, 8], [10.0, 11.0, 12.0, 20.0], 1.5, 256)
    assert c([1]) == 10.0 and c([3]) == 11.5 and c([6]) == 16.0
    assert c([16]) == 36.0  # past the grid: the last slope (2 ms a token)
    assert c([1, 1, 2]) == c.curve(4) + 2 * 1.5 == 15.0  # total tokens plus each extra sequence
    assert c.relative(8) == 2.0


def test_step_cost_memoises_per_token_count(monkeypatch):
    """The planner asks the curve for the same few token counts thousands of times a step:
    each count is interpolated once; the memo is not part of the cached fields."""
    c = StepCost([1, 16], [10.0, 25.0], 2.0, 256, 1024, [1, 16], [14.0, 30.0])
    calls = []
    real = StepCost._interp
    monkeypatch.setattr(StepCost, "_interp", staticmethod(lambda ts, ms, t: calls.append(t) or real(ts, ms, t)))
    first = [c([t], [1024]) for t in (1, 4, 16)]
    n = len(calls)
    assert [c([t], [1024]) for t in (1, 4, 16)] * 3 == first * 3 and len(calls) == n
    assert set(asdict(c)) == {f.name for f in fields(StepCost)}


def test_step_cost_grows_with_each_sequences_committed_length():
    # at context 256: 10 ms + 1 per extra token; at 1024: 14 ms for one token, 30 for 16
    c = StepCost([1, 16], [10.0, 25.0], 2.0, 256, 1024, [1, 16], [14.0, 30.0])
    assert c([1]) == c([1], [256]) == 10.0  # no lengths, or the measured one: the curve
    assert c([1], [1024]) == 14.0 and c([16], [1024]) == 30.0
    assert c([1], [640]) == 12.0  # half-way: half the attention cost
    assert c([16], [1792]) == 25.0 + 5.0 * 2  # past the long context: linear
    assert c([1, 16], [1024, 256]) == c.curve(17) + 2.0 + 4.0
    assert c([1], [0]) == 10.0 - 4.0 / 3  # shorter than measured: cheaper
    assert StepCost([1, 16], [10.0, 25.0], 2.0, 256)([16], [4096]) == 25.0  # no long curve: no term


def _fake_forward_clock(monkeypatch, model, ms):
    """A fake clock under models.cost: each forward of the model takes ``ms(T, longest context)``."""
    import types

    import models.cost as cost

    clock = [0.0]
    monkeypatch.setattr(cost, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    forward = model.forward

    def timed_forward(tokens, meta, *args, **kwargs):
        clock[0] += 1e-3 * ms(tokens.numel(), int(meta.context_lens.max()))
        return forward(tokens, meta, *args, **kwargs)

    monkeypatch.setattr(model, "forward", timed_forward)
    return cost


def test_measured_step_cost_has_a_long_context_curve(tiny, monkeypatch):
    """A step of T tokens takes T ms over the short prefix (32) and 2T + 2 ms over the long one
    (128): the long curve is measured there and a step's prediction moves linearly between them
    with the committed length."""
    from models.cost import LONG_GRID

    cost = _fake_forward_clock(monkeypatch, tiny, lambda T, ctx: T + (T + 2 if ctx >= 100 else 0))
    c = cost.measure_step_cost(tiny, context=32, reps=1)
    assert c.long_context == 128 and c.long_tokens == list(LONG_GRID)
    assert c.long_ms == pytest.approx([2.0 * T + 2 for T in LONG_GRID])
    assert c([4], [32]) == pytest.approx(4.0) and c([4], [128]) == pytest.approx(10.0)
    assert c([4], [80]) == pytest.approx(7.0) and c([16], [128]) == pytest.approx(34.0)


def test_step_cost_cache(tiny, tmp_path):
    fake_cost.calls = 0
    a = step_cost(tiny, tmp_path, measure=fake_cost, probe=fake_probe)
    b = step_cost(tiny, tmp_path, measure=fake_cost, probe=fake_probe)
    assert a == b and fake_cost.calls == 1
    assert a.origin == "measured" and b.origin.startswith("cache (checked now: 1 tokens 10.0 ms")
    (f,) = (tmp_path / "cost").glob("*.json")
    data = json.loads(f.read_text())
    data["cost"]["ms"] = [10.0, 5.0, 12.0, 20.0]  # not non-decreasing: corrupt
    f.write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="unreadable"):
        step_cost(tiny, tmp_path, measure=fake_cost, probe=fake_probe)
    data["key"]["backend"] = "triton"
    data["cost"]["ms"] = [10.0, 11.0, 12.0, 20.0]
    f.write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="another setup"):
        step_cost(tiny, tmp_path, measure=fake_cost, probe=fake_probe)
    assert fake_cost.calls == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step_cost(tiny, tmp_path, measure=fake_cost, probe=fake_probe)  # rewritten: read quietly
    assert fake_cost.calls == 3


def test_a_curve_checked_by_this_process_is_taken_again_within_recheck_s(tiny, tmp_path, monkeypatch):
    """``recheck_s``: a curve this process checked (or measured) less than that long ago is
    returned without a probe, then probed again once the time is up; without it every call
    probes (the bench's runs, each measuring or checking once)."""
    import models.cost as mc

    probes = []

    def probe(model, context, tokens):
        probes.append(context)
        return fake_probe(model, context, tokens)
    clock = [1000.0]
    monkeypatch.setattr(mc.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(mc, "_checked", {})
    fake_cost.calls = 0
    first = step_cost(tiny, tmp_path, measure=fake_cost, probe=probe, recheck_s=600)
    assert first.origin == "measured" and fake_cost.calls == 1 and probes == []
    clock[0] += 599
    again = step_cost(tiny, tmp_path, measure=fake_cost, probe=probe, recheck_s=600)
    assert again == first and probes == [] and again.origin == "checked by this process 599 s ago"
    assert first.origin == "measured"  # a copy: the first caller's curve keeps its origin
    step_cost(tiny, tmp_path, context=128, measure=fake_cost, probe=probe, recheck_s=600)  # another curve
    assert fake_cost.calls == 2
    step_cost(tiny, tmp_path, measure=fake_cost, probe=probe)  # recheck_s 0: probed
    assert probes == [256]
    clock[0] += 599  # 599 s after that check: still fresh
    step_cost(tiny, tmp_path, measure=fake_cost, probe=probe, recheck_s=600)
    clock[0] += 2
    assert step_cost(tiny, tmp_path, measure=fake_cost, probe=probe, recheck_s=600).origin.startswith("cache (checked")
    assert probes == [256, 256] and fake_cost.calls == 2
    step_cost(tiny, tmp_path, measure=fake_cost, probe=probe, recheck_s=600, check=False)  # not checked: no entry
    with pytest.raises(ValueError, match="recheck_s must be >= 0"):
        step_cost(tiny, tmp_path, measure=fake_cost, probe=probe, recheck_s=-1)


def test_a_text_generator_checks_the_step_cost_once_for_many_calls(tiny, tmp_path, monkeypatch):
    """``TextGenerator.generate`` plans each call; a curve checked in the last RECHECK_S is not
    probed again (each probe is 0.1-0.2 s of a call)."""
    import models.cost as mc
    from decoding import TextGenerator
    from decoding.text import RECHECK_S
    from test_inputs import CharTokenizer

    probes = []

    def probe(model, context, tokens):
        probes.append(context)
        return fake_probe(model, context, tokens)
    real = mc.step_cost
    monkeypatch.setattr(mc, "_checked", {})
    monkeypatch.setattr(mc, "step_cost", lambda *a, **k: real(*a, **k, measure=fake_cost, probe=probe))
    gen = TextGenerator(tiny, CharTokenizer(), cache_dir=tmp_path)
    real(tiny, tmp_path, measure=fake_cost, probe=probe, check=False)  # a cached curve, as after a first run
    for _ in range(3):
        gen.generate("hello", "pld", max_new_tokens=4)
    assert len(probes) == 1 and RECHECK_S >= 60


def test_a_saved_step_cost_is_loaded_as_it_is(tiny, tmp_path):
    """save_step_cost / load_step_cost: the same curve back (from a saved file or from the cache
    file itself), never checked against the machine; a bad file is an error naming it."""
    from models.cost import load_step_cost, save_step_cost

    c = StepCost([1, 16], [10.0, 25.0], 2.0, 256, 1024, [1, 16], [14.0, 30.0])
    save_step_cost(c, tmp_path / "out" / "step_cost.json")
    back = load_step_cost(tmp_path / "out" / "step_cost.json")
    assert back == c and back([8], [700]) == c([8], [700])
    assert back.origin == f"file {tmp_path / 'out' / 'step_cost.json'}"
    fake_cost.calls = 0
    cached = step_cost(tiny, tmp_path / "cache", measure=fake_cost, probe=fake_probe)
    (f,) = (tmp_path / "cache" / "cost").glob("*.json")
    assert load_step_cost(f) == cached
    with pytest.raises(ValueError, match="does not exist"):
        load_step_cost(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    for text in ("not json", "[1, 2]", json.dumps({"cost": {"tokens": [1, 2]}}),
                 json.dumps({"cost": dict(asdict(c), ms=[10.0, 5.0])})):  # missing fields; decreasing
        bad.write_text(text)
        with pytest.raises(ValueError, match=f"step-cost file {bad} (is not JSON|has no 'cost'|is not a usable)"):
            load_step_cost(bad)


@pytest.mark.parametrize("now, why", [
    ({1: 10.0, 16: 36.0}, None),  # as cached (16 tokens: 36 ms, past the grid)
    ({1: 12.4, 16: 44.6}, None),  # 24% slower everywhere, same shape: within the tolerance
    ({1: 7.9, 16: 28.4}, "a one-token step takes 7.9 ms, the cache says 10.0"),  # faster machine
    ({1: 13.0, 16: 46.8}, "a one-token step takes 13.0 ms, the cache says 10.0"),  # 30% slower
    ({1: 10.0, 16: 46.0}, "a 16-token step costs 4.60x a one-token step, the cache says 3.60x"),  # shape changed
    ({1: 10.0, 16: 28.0}, "a 16-token step costs 2.80x a one-token step, the cache says 3.60x"),
])
def test_cached_step_cost_is_checked_against_the_machine_now(tiny, tmp_path, now, why):
    """A curve cached on a faster or quieter day must not plan today's steps: a cached curve is
    checked with steps timed now, and measured again (with a warning) when it drifted."""
    from models.cost import drifted

    c = StepCost([1, 2, 4, 8], [10.0, 11.0, 12.0, 20.0], 1.5, 256)
    assert drifted(c, now) == why
    fake_cost.calls = 0
    step_cost(tiny, tmp_path, measure=fake_cost, probe=fake_probe)
    probe = lambda model, context, tokens: {t: now[t] for t in tokens}  # noqa: E731
    if why is None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert step_cost(tiny, tmp_path, measure=fake_cost, probe=probe).origin.startswith("cache (checked")
        assert fake_cost.calls == 1
    else:
        with pytest.warns(UserWarning, match="no longer matches this machine"):
            again = step_cost(tiny, tmp_path, measure=fake_cost, probe=probe)
        assert fake_cost.calls == 2 and again.origin == f"measured again ({why})"
        step_cost(tiny, tmp_path, measure=fake_cost, probe=fake_probe)  # the new curve was written
        assert fake_cost.calls == 2
    assert step_cost(tiny, tmp_path, measure=fake_cost, probe=probe, check=False).origin == "cache (not checked)"


def test_probe_times_the_check_steps(tiny):
    from models.cost import CHECK_TOKENS, probe_step_cost

    seen = probe_step_cost(tiny, context=16, rounds=1)
    assert sorted(seen) == sorted(CHECK_TOKENS) and all(0 < ms < float("inf") for ms in seen.values())
    seen = probe_step_cost(tiny, context=16, tokens=(1, 4), rounds=1)
    assert sorted(seen) == [1, 4]
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        probe_step_cost(tiny, context=16, rounds=0)
    with pytest.raises(ValueError, match="tokens must be a non-empty list"):
        probe_step_cost(tiny, context=16, tokens=())
    with pytest.raises(ValueError, match="min_s must be >= 0"):
        probe_step_cost(tiny, context=16, min_s=-1.0)


def test_drift_rule_rejects_what_it_cannot_judge():
    from models.cost import drifted

    c = StepCost([1, 2, 4, 8], [10.0, 11.0, 12.0, 20.0], 1.5, 256)
    with pytest.raises(ValueError, match="one-token step"):
        drifted(c, {16: 30.0})
    with pytest.raises(ValueError, match="tol must be > 0"):
        drifted(c, {1: 10.0}, tol=0.0)


def test_measured_step_cost_is_a_non_decreasing_curve(tiny, monkeypatch):
    """Timings that fall as the step grows (an 8-token step timed at 2 ms, after 6 ms for 6
    tokens) are lifted to the largest time of any smaller step: the curve never falls, and is
    otherwise what was measured."""
    cost = _fake_forward_clock(monkeypatch, tiny, lambda T, ctx: 2.0 if T == 8 else float(T))
    c = cost.measure_step_cost(tiny, context=16, reps=1)
    assert c.tokens == list(cost.GRID)
    assert c.ms == pytest.approx([6.0 if T == 8 else float(T) for T in cost.GRID])
    assert c.per_seq_ms == pytest.approx(0.0)  # one-token steps of b sequences take b ms: no extra per sequence


def test_measured_step_cost_drops_a_transient(tiny, monkeypatch):
    """A slow spell (another process, page faults after a model load) over the first forwards
    must not reach the curve: each point is the fastest of rounds over the whole grid, so the
    spell hits one round of a few points only. A fake clock makes a step of T tokens cost T ms."""
    import types

    import models.cost as cost

    clock = [0.0]
    monkeypatch.setattr(cost, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    forward, calls = tiny.forward, [0]

    def timed_forward(tokens, *args, **kwargs):
        calls[0] += 1
        clock[0] += 1e-3 * tokens.numel() + (1.0 if calls[0] <= 8 else 0.0)  # the spell: +1 s each
        return forward(tokens, *args, **kwargs)

    monkeypatch.setattr(tiny, "forward", timed_forward)
    c = cost.measure_step_cost(tiny, context=16, reps=2)
    assert calls[0] > 8  # the spell happened
    assert c.ms == pytest.approx([float(t) for t in c.tokens])
    assert c.long_ms == pytest.approx([float(t) for t in c.long_tokens]) and c.per_seq_ms == pytest.approx(0.0)


def test_step_cost_is_measured_again_for_another_kernel_build(tiny, tmp_path, monkeypatch):
    """The costs depend on the CPU kernels: a cost cached with another build is not reused."""
    from kernels import skinny

    fake_cost.calls = 0
    step_cost(tiny, tmp_path, measure=fake_cost, probe=fake_probe)
    monkeypatch.setattr(skinny, "build_tag", lambda: "another-build")
    step_cost(tiny, tmp_path, measure=fake_cost, probe=fake_probe)
    assert fake_cost.calls == 2


def test_skinny_wins_within_its_margin(tiny, tmp_path, monkeypatch):
    """``skinny`` is kept when another form is faster by less than SKINNY_MARGIN (it lets the
    whole layer stack run as one call), and loses when it is slower by more."""
    from models.tune import SKINNY_MARGIN

    make, _ = _timed_forms(monkeypatch)
    near = make(lambda form, r: 1.0 if form == "wxt" else (1.0 + SKINNY_MARGIN) / 2 if form == "skinny" else 3.0)
    steps = ["skinny"] * (len(BUCKETS) - 1) + ["wxt"]  # not at prefill's rows: there the fastest wins
    assert all(t == steps for t in tune_model(tiny, tmp_path / "a", "off", timer=near).values())
    far = make(lambda form, r: 1.0 if form == "wxt" else SKINNY_MARGIN + 0.1 if form == "skinny" else 3.0)
    assert all(t == ["wxt"] * len(BUCKETS) for t in tune_model(tiny, tmp_path / "b", "off", timer=far).values())


@pytest.mark.skipif(not skinny.available(), reason=f"skinny kernel: {skinny.unavailable_reason()}")
@pytest.mark.parametrize("stack_faster", [True, False])
def test_whole_stack_decided_by_timing_forwards(tiny, tmp_path, monkeypatch, stack_faster):
    """Where a layer product measured faster in another form at a step's rows, a forward with
    every layer product ``skinny`` (one C call for the stack) is timed against the forward as
    planned; the faster decides the layer products' forms at that bucket (up to STACK_ROWS
    rows), the LM head keeps its own, and the forwards really run."""
    from models.tune import STACK_ROWS

    make, _ = _timed_forms(monkeypatch)
    by_product = make(lambda form, r: 1.0 if form == "wxt" else 2.0)
    configs = []

    def stack_timer(fn, reps):
        fn()
        all_skinny = "skinny" in tiny.layers[0].wqkv.plan.table  # the products alone chose wxt everywhere
        configs.append(all_skinny)
        return (1.0 if all_skinny else 2.0) if stack_faster else (2.0 if all_skinny else 1.0)

    tables = tune_model(tiny, tmp_path, "off", timer=by_product, stack_timer=stack_timer)
    head = _shape_of(tiny.head_weight, None)
    small = [m <= STACK_ROWS for m in BUCKETS]
    for shape, table in tables.items():
        want = ["skinny" if s and stack_faster and shape != head else "wxt" for s in small]
        assert table == want, shape
    assert configs.count(True) == configs.count(False) == 3 * sum(small)
    # every decoding step's bucket, the widest (STEP_ROWS) included, is decided as a whole: a
    # 24-64-row step had stayed off the stack on a per-product pick
    from models.linear import STEP_ROWS
    assert small == [m <= STEP_ROWS for m in BUCKETS]
    assert tiny.layers[0].w_down.plan.table == tables[_shape_of(tiny.layers[0].w_down.weight, None)]
    with pytest.raises(ValueError, match="stack_timer must be None or a callable"):
        tune_model(tiny, tmp_path / "bad", "off", timer=by_product, stack_timer=3)


def _shape_of(w, b):
    from models.tune import _shape_key
    return _shape_key(w, b)


@pytest.mark.skipif(not skinny.available(), reason=f"skinny kernel: {skinny.unavailable_reason()}")
def test_a_cached_table_off_the_stack_is_checked_again(tiny, tmp_path, monkeypatch):
    """A cached table whose decoding buckets keep a layer product off the one-call stack (tuned
    in a noisy moment) is timed against all-skinny again when it is read; where all-skinny wins
    now, the table and its cache file are corrected. An all-skinny table is not timed again."""
    from models.tune import STACK_ROWS

    make, _ = _timed_forms(monkeypatch)
    by_product = make(lambda form, r: 1.0 if form == "wxt" else 2.0)

    def stack(all_skinny_faster: bool, seen: list):
        def timer(fn, reps):
            fn()
            all_skinny = "skinny" in tiny.layers[0].wqkv.plan.table
            seen.append(all_skinny)
            return (1.0 if all_skinny else 2.0) if all_skinny_faster else (2.0 if all_skinny else 1.0)
        return timer

    first = tune_model(tiny, tmp_path, "off", timer=by_product, stack_timer=stack(False, []))
    assert all(t == ["wxt"] * len(BUCKETS) for t in first.values())  # noise, say, kept the stack off
    seen = []
    again = tune_model(tiny, tmp_path, "off", timer=by_product, stack_timer=stack(True, seen))
    head = _shape_of(tiny.head_weight, None)
    small = [m <= STACK_ROWS for m in BUCKETS]
    for shape, table in again.items():
        assert table == ["skinny" if s and shape != head else "wxt" for s in small], shape
    assert seen and tiny.layers[0].wqkv.plan.table == again[_shape_of(tiny.layers[0].wqkv.weight, None)]
    cached = json.loads(next((tmp_path / "tune").glob("*.json")).read_text())["tables"]
    assert cached == again  # the cache was corrected
    seen.clear()
    assert tune_model(tiny, tmp_path, "off", timer=by_product, stack_timer=stack(False, seen)) == again
    assert seen == []  # every decoding bucket all-skinny: nothing timed
