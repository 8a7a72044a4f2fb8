"""The compiled host path (decoding/compiled.py, decoding/cpu/*.c) against its Python reference:
the same plans, selections and learnt estimates, bit for bit, on exact tables and random steps."""

import random
from array import array

import pytest

from decoding import compiled
from decoding.planner import AcceptKey, Planner, PlannerConfig
from decoding.proposer import Outcome
from decoding.tree import DRAFT, HARVEST, PLD, POOL, RECYCLE, STORE, SUFFIX, WINDOW, StepTree
from models.cost import StepCost

pytestmark = pytest.mark.skipif(not compiled.available(), reason=f"not built: {compiled.path()}")

# a measured CPU curve's shape, with the attention term of a longer context
COST = StepCost(tokens=[1, 2, 4, 8, 16, 32, 64], ms=[20.0, 21.5, 22.0, 23.5, 31.0, 52.0, 101.0], per_seq_ms=0.7,
                context=256, long_context=1024, long_tokens=[1, 4, 16, 64], long_ms=[21.0, 23.9, 36.5, 140.0])
FLAT = StepCost(tokens=[1, 64], ms=[10.0, 10.0], per_seq_ms=0.0, context=256)
STEEP = StepCost(tokens=[1, 2, 64], ms=[10.0, 30.0, 1270.0], per_seq_ms=0.0, context=256)
SOURCES = (PLD, POOL, HARVEST, RECYCLE, SUFFIX, STORE, PLD | SUFFIX, RECYCLE | POOL, HARVEST | PLD)


def pair(cost, cfg=None, extension: bool = True) -> tuple[Planner, Planner]:
    """(reference, compiled) planners on the same cost; the compiled one's calls glued in the
    extension (decoding/cpu/glue.c) or in Python."""
    before, ext = compiled.use_compiled(False), compiled.use_extension(extension)
    try:
        ref = Planner(cost, cfg)
        compiled.use_compiled(True)
        fast = Planner(cost, cfg)
    finally:
        compiled.use_compiled(before)
        compiled.use_extension(ext)
    assert ref._core is None and fast._core is not None
    if extension and compiled.EXT.get() is None:
        pytest.skip(f"the planner's extension did not build: {compiled.EXT.reason}")
    assert (fast._core._ext is not None) == extension
    return ref, fast


def with_arrays(tree: StepTree) -> StepTree:
    """The tree with the arrays a tree built in C keeps (``BuiltTree.flat``), which the compiled
    glue reads instead of its lists."""
    tree.flat = (array("i", tree.parents), array("i", tree.depths), array("i", tree.sources), array("i", tree.group),
                 array("b", tree.candidate))
    return tree


def chain(n: int, source: int = PLD) -> StepTree:
    t = StepTree.root(0)
    t.add_chain(list(range(1, n + 1)), source)
    return t


def random_tree(rng: random.Random, draft: bool = False) -> StepTree:
    t = StepTree.root(rng.randrange(50))
    for _ in range(rng.randrange(0, 9)):
        t.add_chain([rng.randrange(6) for _ in range(rng.randrange(1, 9))], rng.choice(SOURCES))
    for g in range(rng.choice((0, 0, 2, 4))):  # lookahead window columns: private groups under the root
        nodes = t.add_private_chain(0, [rng.randrange(50) for _ in range(3)], WINDOW, group=g)
        t.extra_logits.update(nodes[:-1])
    cands = [n for n in range(1, len(t)) if t.candidate[n]]
    if draft and cands:
        n = rng.choice(cands)
        t.chance[n] = rng.random()
        t.sources[n] = DRAFT
        if rng.random() < 0.5:
            t.pinned.add(n)
    return t


def outcome_of(rng: random.Random, tree: StepTree, keep: list[int]) -> Outcome:
    """A step's outcome: a random accepted path through the kept candidates."""
    kept, path = set(keep), [0]
    while True:
        kids = [c for c in tree.children[path[-1]].values() if c in kept]
        if not kids or rng.random() < 0.3:
            break
        path.append(rng.choice(kids))
    rows = {n: j for j, n in enumerate(n for n in keep if tree.candidate[n] or n in tree.extra_logits)}
    return Outcome(tree=tree, path=path, new_tokens=[tree.tokens[n] for n in path[1:]] + [1], logits=None,
                   rows=rows, sent=len(keep))


def same_state(ref: Planner, fast: Planner, keys: set) -> None:
    assert (ref.window_credit, ref.window_columns, ref._cal, ref.log) == \
           (fast.window_credit, fast.window_columns, fast._cal, fast.log)
    assert (ref.overhead_ms, ref.overhead_per_token, ref._ovh, ref.version, ref._sent_expect) == \
           (fast.overhead_ms, fast.overhead_per_token, fast._ovh, fast.version, fast._sent_expect)
    for plan in (ref, fast):  # what the compiled calls read, kept as the properties say
        assert (plan._calibration, plan._window_rate) == (plan.calibration, plan.window_rate)
    for sid, acc in ref.seq_acc.items():
        other = fast.seq_acc[sid]
        assert acc.streak == other.streak
        for key in keys:
            assert acc._rates(key) == other._rates(key), key


def all_keys() -> set:
    return {AcceptKey(1 << b, d, r, s, k) for b in range(9) for d in range(1, 9) for r in range(4)
            for s in (False, True) for k in range(3)}


def test_exact_tables():
    """Known plans on a flat and a steep curve, both paths alike."""
    fixed = PlannerConfig(prior=0.4, learn_overhead=False, explore=0.0, decay=1.0)
    for cost, keep, depth in ((FLAT, list(range(7)), 8), (STEEP, [0], 0)):  # 0.4 ** 8 < 1e-3: no deeper
        for plan in pair(cost, fixed):
            assert plan.select([0], [chain(6)]) == [keep]
            assert plan.max_depth([0], PLD) == [depth]
    # the window's columns: taken whole, or not at all
    t = chain(2)
    t.add_private_chain(0, [7, 8], WINDOW, group=0)
    for plan in pair(FLAT, PlannerConfig(prior=0.4, learn_overhead=False, explore=0.0, window_rate=0.3)):
        assert plan.select([0], [t]) == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize("glue", ["extension", "python"])
@pytest.mark.parametrize("seed", range(6))
def test_random_steps_plan_select_and_learn_the_same(seed, glue):
    rng = random.Random(seed)
    cfg = PlannerConfig(learn_overhead=seed % 2 == 0, max_step_tokens=None if seed % 3 else 24,
                        min_gain=0.05 * (seed % 2), calibrate=seed != 5, window_rate=(0.15, 0.9)[seed % 2])
    ref, fast = pair(COST, cfg, extension=glue == "extension")
    keys = all_keys()
    for step in range(25):
        B = rng.randrange(1, 5)
        sids = rng.sample(range(6), B)
        contexts = [rng.randrange(10, 2000) for _ in sids] if rng.random() < 0.7 else None
        sources = rng.choice((PLD, PLD | POOL | HARVEST | WINDOW, PLD | RECYCLE | SUFFIX | POOL, 0))
        assert ref.max_depth(sids, sources, contexts) == fast.max_depth(sids, sources, contexts)
        trees = [random_tree(rng, draft=seed == 4) for _ in sids]
        trees = [with_arrays(t) if rng.random() < 0.5 else t for t in trees]
        keep = ref.select(sids, trees)
        assert fast.select(sids, trees) == keep
        outs = [outcome_of(rng, tree, k) for tree, k in zip(trees, keep)]
        wall = rng.uniform(4, 60)  # below the curve too: the learnt time beyond it negative, at the floor
        if step % 3 == 2:  # the whole step's learning in one call (one compiled call on the fast path)
            one_call = glue == "extension" and not any(t.pinned or t.chance for t in trees)
            if one_call:  # the extension learns it all: the two methods it replaces are not called
                fast.observe_all = fast.observe_time = None
            for plan in (ref, fast):
                plan.observe_step(sids, outs, [len(k) for k in keep], wall, B + step % 3, model_ms=step % 2 * 1.5)
            if one_call:
                del fast.observe_all, fast.observe_time
            same_state(ref, fast, keys)
            continue
        if step % 2:  # one call for the step's outcomes (one compiled call on the fast path), or one per sequence
            ref.observe_all(sids, outs)
            fast.observe_all(sids, outs)
        else:
            for sid, out in zip(sids, outs):
                ref.observe(sid, out)
                fast.observe(sid, out)
        for plan in (ref, fast):
            plan.observe_time([len(k) for k in keep], wall, B + step % 3)
        same_state(ref, fast, keys)


@pytest.mark.parametrize("seed", range(4))
def test_a_step_learnt_in_one_call_plans_the_next_steps_depths_as_max_depth_would(seed):
    """observe_step on the extension also plans the next step (every sequence going on, its context
    grown by its new tokens): the next max_depth answers from it, without its compiled call, what
    the reference computes; a batch that lost a sequence, other sources or other contexts are
    planned by max_depth itself. Every learnt number stays the reference's."""
    rng = random.Random(seed)
    cfg = PlannerConfig(learn_overhead=seed % 2 == 0, calibrate=seed != 3)
    ref, fast = pair(COST, cfg)
    keys = all_keys()
    sids, contexts, sources = [2, 7, 4][:1 + seed % 3], None, PLD | POOL | HARVEST | WINDOW
    contexts = [rng.randrange(10, 900) for _ in sids]
    calls = []
    real = fast._core.max_depth
    fast._core.max_depth = lambda *a: calls.append(1) or real(*a)
    for step in range(20):
        if step == 12 and len(sids) > 1:  # a sequence finished: the batch the next step planned is not this one
            sids, contexts = sids[1:], contexts[1:]
        if step == 15:
            sources = PLD | RECYCLE
        before = len(calls)
        assert ref.max_depth(sids, sources, list(contexts)) == fast.max_depth(sids, sources, list(contexts))
        assert len(calls) - before == (step in (0, 15) or (step == 12 and seed % 3 > 0)), step
        trees = [random_tree(rng) for _ in sids]
        keep = ref.select(sids, trees)
        assert fast.select(sids, trees) == keep
        outs = [outcome_of(rng, tree, k) for tree, k in zip(trees, keep)]
        wall = rng.uniform(4, 60)  # below the curve too: the learnt time beyond it negative, at the floor
        for plan in (ref, fast):
            plan.observe_step(sids, outs, [len(k) for k in keep], wall, len(sids))
        same_state(ref, fast, keys)
        contexts = [c + len(o.new_tokens) for c, o in zip(contexts, outs)]


def test_a_planner_starts_from_the_tables_an_earlier_planner_of_its_cost_made():
    """A later planner of the same cost copies the cost's tabulated curve and slope (the bench
    makes a planner per generate call) and plans, selects and learns as the reference does,
    from its first call on."""
    cost = StepCost(tokens=list(COST.tokens), ms=list(COST.ms), per_seq_ms=COST.per_seq_ms, context=COST.context,
                    long_context=COST.long_context, long_tokens=list(COST.long_tokens), long_ms=list(COST.long_ms))
    first = pair(cost)[1]  # tabulates more than the steps below need
    first.max_depth([0, 1, 2, 3], PLD, [300, 1500, 20, 9])
    first.select([0, 1, 2, 3], [chain(90) for _ in range(4)])
    made = cost._planner_tables
    assert len(made[0]) > 1 and len(made[1]) > 1
    rng, keys = random.Random(4), all_keys()
    ref, fast = pair(cost, PlannerConfig(learn_overhead=True))
    assert list(fast._core.curve) == list(made[0]) and fast._core.curve is not made[0]
    # the C calls read the copies from the first call on (a null table: they refuse, and the
    # reference answers in their place)
    assert fast._core._cost_args.curve == fast._core.curve.buffer_info()[0]
    assert fast._core._cost_args.slope == fast._core.slope.buffer_info()[0]
    for step in range(12):
        sids = rng.sample(range(4), rng.randrange(1, 4))
        contexts = [rng.randrange(10, 2000) for _ in sids]
        assert fast.max_depth(sids, PLD | SUFFIX, contexts) == ref.max_depth(sids, PLD | SUFFIX, contexts)
        trees = [random_tree(rng) for _ in sids]
        keep = ref.select(sids, trees)
        assert fast.select(sids, trees) == keep
        outs = [outcome_of(rng, tree, k) for tree, k in zip(trees, keep)]
        wall = rng.uniform(4, 60)  # below the curve too: the learnt time beyond it negative, at the floor
        for plan in (ref, fast):
            plan.observe_all(sids, outs)
            plan.observe_time([len(k) for k in keep], wall, len(sids))
        same_state(ref, fast, keys)
    assert len(cost._planner_tables[0]) >= len(made[0])  # the longest tables made so far


@pytest.mark.parametrize("contexts", [False, True], ids=["no-contexts", "contexts"])
def test_one_sequence_step_after_step_plans_with_what_the_last_step_taught(contexts):
    """The same sequence step after step (the compiled calls find their structures as the step
    before left them): each plan sees the streak and host time the last step learnt, as the
    reference's does."""
    rng = random.Random(9)
    ref, fast = pair(COST, PlannerConfig(learn_overhead=True, window_rate=0.3))
    keys = all_keys()
    for step in range(40):
        ctx = [200 + 7 * step] if contexts else None
        depth = ref.max_depth([3], PLD | SUFFIX | RECYCLE, ctx)
        assert fast.max_depth([3], PLD | SUFFIX | RECYCLE, None if ctx is None else list(ctx)) == depth
        tree = random_tree(rng)
        keep = ref.select([3], [tree])
        assert fast.select([3], [tree]) == keep
        out = outcome_of(rng, tree, keep[0])
        if step % 3:  # else a step whose outcome is not learnt from: its host time alone changes
            ref.observe_all([3], [out])
            fast.observe_all([3], [out])
        wall = rng.uniform(4, 60)  # below the curve too: the learnt time beyond it negative, at the floor
        for plan in (ref, fast):
            plan.observe_time([len(keep[0])], wall, 1 + out.accepted)
        same_state(ref, fast, keys)
        assert (ref.overhead_ms, ref.overhead_per_token) == (fast.overhead_ms, fast.overhead_per_token)
    for plan in (ref, fast):  # a step of no sequence (no call of the loop makes one): the cost's own answer
        plan.observe_time([], 20.0, 0)
    same_state(ref, fast, keys)


def test_switch_and_path():
    before = compiled.use_compiled(False)
    try:
        assert compiled.path().startswith("reference") and Planner(COST)._core is None
        compiled.use_compiled(True)
        assert compiled.path() == "compiled" and Planner(COST)._core is not None
        assert Planner(lambda tokens, contexts=None: 10.0)._core is None  # a cost it cannot tabulate
    finally:
        compiled.use_compiled(before)


def test_host_step_replays_methods_on_both_paths_with_the_same_plans(smol, smol_prompts):
    """bench/host_step.py: the oracle's replay returns ar's answers, and both host paths make
    the same steps (the same tau) from them."""
    from bench.host_step import DEFAULT_COST, answers_for, run_method
    from models.cost import load_step_cost

    model, _ = smol
    prompts = smol_prompts[:2]
    answers = answers_for(model, prompts, 12)
    cost = load_step_cost(DEFAULT_COST)
    before = compiled.use_compiled(True)
    try:
        for m in ("ar", "pld", "lookahead+pld", "hybrid"):
            runs = []
            for on in (True, False):
                compiled.use_compiled(on)
                runs.append(run_method(model, m, [prompts], answers, 12, cost, plan=True))
            assert all(r["identical"] and r["steps"] > 0 for r in runs), m
            assert runs[0]["tau"] == runs[1]["tau"], m

        class Flush:  # --cold's buffer: read once in each step's place of the forward
            reads = 0

            def sum(self):
                Flush.reads += 1

        cold = run_method(model, "pld", [prompts], answers, 12, cost, plan=True, flush=Flush())
        assert cold["identical"] and Flush.reads == cold["steps"] > 0  # one batch step a forward
        # --calls: each host phase's Python calls a step, the same every run, the clock's mark among them
        counted = [run_method(model, m, [prompts], answers, 12, cost, plan=True, calls=True)["calls"]
                   for m in ("pld", "pld", "ar")]
        assert counted[0] == counted[1] and all(counted[0][p] >= 1 for p in counted[0])
        assert counted[0]["host"] == sum(v for p, v in counted[0].items() if p != "host") > counted[2]["host"]
    finally:
        compiled.use_compiled(before)


def test_host_step_refuses_a_negative_cold_buffer():
    from bench.host_step import parse_args

    assert parse_args(["--cold", "100"]).cold == 100
    with pytest.raises(SystemExit):
        parse_args(["--cold", "-1"])


def test_without_a_compiler_the_reference_runs_with_one_warning(monkeypatch, tmp_path):
    lib = compiled.LIBRARY
    monkeypatch.setattr(compiled, "LIBRARY", compiled.cbuild.OnDemand(lib.name, lib.sources, lib.flags, lib.libs,
                                                                        lib.declare, lib.fallback))
    monkeypatch.setattr(compiled.cbuild, "_host", {"compiled": True})
    monkeypatch.setenv("SPECDEC_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")  # "compiles" nothing
    with pytest.warns(RuntimeWarning, match="runs its Python reference"):
        assert not compiled.available()
    assert compiled.path().startswith("reference (could not build")
    assert Planner(COST)._core is None and Planner(COST).select([0], [chain(3)])[0][0] == 0
    assert list(tmp_path.iterdir()) == []  # no half-written library left behind


def test_without_python_headers_the_planner_glues_in_python_with_one_warning(monkeypatch):
    ext = compiled.EXT
    monkeypatch.setattr(compiled, "EXT", compiled.cbuild.OnDemandModule(ext.name, ext.sources, ext.fallback))
    monkeypatch.setattr(compiled.cbuild, "python_include", lambda: None)
    monkeypatch.setattr(compiled.cbuild, "_host", {"compiled": True})
    with pytest.warns(RuntimeWarning, match="headers.*glued in Python"):
        plan = Planner(FLAT, PlannerConfig(prior=0.4, learn_overhead=False, explore=0.0, decay=1.0))
    assert plan._core is not None and plan._core._ext is None
    assert plan.select([0], [chain(6)]) == [list(range(7))] and plan.max_depth([0], PLD) == [8]
