"""The generate loop's own compiled glue (decoding/cpu/glue_step.c) against its Python reference
(decoding/generate.py ``send`` and ``record``): the same trees, rows, inputs and statistics, field
for field and in the same order, on random steps; the calls it does not take left to the
reference, unchanged."""

import random
from collections import Counter

import pytest
import torch

from decoding import compiled
from decoding.generate import Sequence, generate, record, send, settle
from decoding.methods import make_proposer
from decoding.planner import Planner, PlannerConfig
from decoding.proposer import Outcome, Proposer, SeqState
from decoding.stats import SeqStats
from decoding.tree import DRAFT, StepTree
from helpers import ours_from_hf, tiny_hf_model
from models.cost import StepCost
from test_compiled import outcome_of, random_tree, with_arrays

pytestmark = pytest.mark.skipif(not compiled.available(), reason=f"not built: {compiled.path()}")


@pytest.fixture(scope="module")
def glue():
    g = compiled.EXT.get()
    if g is None:
        pytest.skip(f"the extension did not build: {compiled.EXT.reason}")
    return g


def closed_subset(rng: random.Random, tree: StepTree) -> list[int]:
    """Increasing nodes from the root, each kept node's parent kept (what select returns)."""
    keep = [0]
    for n in range(1, len(tree)):
        if tree.parents[n] in keep and rng.random() < 0.6:
            keep.append(n)
    return keep


def fields(tree: StepTree) -> tuple:
    """Every field, dicts and sets with their order (equality alone ignores it)."""
    return (type(tree), tree.tokens, tree.parents, tree.depths, tree.sources, tree.candidate,
            [list(d.items()) for d in tree.children], list(tree.extra_logits), tree.group, list(tree.chance.items()),
            list(tree.pinned))


def same_send(a, b) -> None:
    (sent_a, rows_a, in_a), (sent_b, rows_b, in_b) = a, b
    assert [fields(t) for t in sent_a] == [fields(t) for t in sent_b]
    assert [list(r.items()) for r in rows_a] == [list(r.items()) for r in rows_b]
    assert in_a == in_b
    for made, ref in zip(sent_a + in_a, sent_b + in_b):  # made in C as __init__ makes them: even vars' order
        assert type(made) is type(ref) and list(vars(made)) == list(vars(ref))


@pytest.mark.parametrize("seed", range(8))
def test_send_makes_the_references_trees_rows_and_inputs(glue, seed):
    rng = random.Random(seed)
    for _ in range(30):
        B = rng.randrange(1, 5)
        trees = [random_tree(rng, draft=seed % 2 == 1) for _ in range(B)]
        trees = [with_arrays(t) if rng.random() < 0.3 else t for t in trees]
        for t in trees:  # nodes of private groups asked for, and pinned ones: remapped in the subtree
            if rng.random() < 0.3 and len(t) > 1:
                t.pinned.add(rng.randrange(1, len(t)))
        sids = rng.sample(range(10), B)
        keep = None if rng.random() < 0.2 else [closed_subset(rng, t) if rng.random() < 0.8 else list(range(len(t)))
                                                for t in trees]
        out = glue.send(trees, keep, sids, StepTree, send.__globals__["StepInput"])
        assert out is not None
        same_send(out, send(sids, trees, keep))
        for b, t in enumerate(out[0]):  # the proposer's own tree where nothing was dropped
            assert (t is trees[b]) == (keep is None or len(keep[b]) == len(trees[b]))


def test_send_leaves_what_it_does_not_take_to_the_reference(glue):
    from models.runner import StepInput

    t = StepTree.root(5)
    t.add_chain([1, 2, 3], 1)
    t.add_chain([1, 4], 1)  # nodes 1 2 3, then 4 under 1
    for bad in ([0, 2], [1, 2], [0, 2, 1], [0, 1, 1], [0, 1, 9]):  # a parent dropped, no root, not increasing, ...
        assert glue.send([t], [bad], [0], StepTree, StepInput) is None
    with pytest.raises(ValueError, match="keeps the root"):
        send([0], [t], [[0, 2]], glue)

    class OwnRows(StepTree):  # a tree class of its own logit_nodes: the reference calls it
        def logit_nodes(self):
            return [0]

    own = OwnRows([5, 1], [-1, 0], [0, 1], [0, 1], [True, True], [{1: 1}, {}], set(), [-1, -1], {}, set())
    assert glue.send([own], None, [0], StepTree, StepInput) is None
    assert send([0], [own], None, glue)[1] == [{0: 0}]

    class Plain(StepTree):  # a subclass that keeps the methods: taken, subtrees made as StepTree
        pass

    plain = Plain(*[getattr(t, f) for f in ("tokens", "parents", "depths", "sources", "candidate", "children",
                                              "extra_logits", "group", "chance", "pinned")])
    out = glue.send([plain], [[0, 1, 4]], [3], StepTree, StepInput)
    same_send(out, send([3], [plain], [[0, 1, 4]]))
    assert type(out[0][0]) is StepTree and out[2][0].parents is None  # 0 -> 1 -> 4: a chain


def random_outcome(rng: random.Random, tree: StepTree) -> Outcome:
    keep = closed_subset(rng, tree)
    out = outcome_of(rng, tree, keep)
    out.new_tokens = out.new_tokens[:rng.randrange(0, len(out.new_tokens) + 1)]  # cut at EOS or length
    out.sent = len(keep) + rng.randrange(3)
    return out


def stats_of(s: SeqStats) -> tuple:
    """The statistics with their counters' key order (what as_dict writes out)."""
    return (s.forwards, s.step_tokens, list(s.accepted_hist.items()), list(s.proposed.items()),
            list(s.accepted.items()), s.accept_lengths)


@pytest.mark.parametrize("seed", range(6))
def test_record_keeps_the_references_statistics(glue, seed):
    rng = random.Random(seed)
    seqs = {sid: (Sequence(SeqState(sid, [1], 1), 50), Sequence(SeqState(sid, [1], 1), 50)) for sid in range(6)}
    for _ in range(40):
        sids = rng.sample(range(6), rng.randrange(1, 5))
        outcomes = [random_outcome(rng, random_tree(rng, draft=seed % 2 == 0)) for _ in sids]
        for o in outcomes:  # a draft node merged with others: a source bit set of several names
            for n in range(1, len(o.tree)):
                if o.tree.sources[n] == DRAFT and rng.random() < 0.5:
                    o.tree.sources[n] |= 1 | 128
        fast = glue.record([seqs[s][0] for s in sids], outcomes, SeqStats, record.__globals__["SOURCE_NAMES"])
        assert fast is not None
        assert fast == record([seqs[s][1] for s in sids], outcomes)
    for a, b in seqs.values():
        assert stats_of(a.stats) == stats_of(b.stats)
    assert any(a.stats.proposed for a, _ in seqs.values())


def test_record_leaves_other_statistics_to_the_reference_unchanged(glue):
    from decoding.tree import SOURCE_NAMES

    class Mine(SeqStats):  # a statistics class of its own: its record runs
        def record(self, outcome):
            self.forwards += 10

    rng = random.Random(0)
    tree = random_tree(rng)
    plain, own = Sequence(SeqState(0, [1], 1), 9), Sequence(SeqState(1, [1], 1), 9, stats=Mine())
    outs = [random_outcome(rng, tree), random_outcome(rng, tree)]
    assert glue.record([plain, own], outs, SeqStats, SOURCE_NAMES) is None
    assert plain.stats.forwards == 0  # nothing recorded where the call is not taken
    record([plain, own], outs, glue)
    assert (plain.stats.forwards, own.stats.forwards) == (1, 10)
    bad = random_outcome(rng, tree)
    bad.rows = {len(tree) + 3: 0}  # a row of no node: the reference raises
    assert glue.record([plain], [bad], SeqStats, SOURCE_NAMES) is None and plain.stats.forwards == 1
    assert isinstance(plain.stats.proposed, Counter)


@pytest.mark.parametrize("method", ["pld", "hybrid", "lookahead+pld"])
def test_generate_decodes_and_counts_alike_on_both_paths(method):
    """The whole loop with its glue and with the reference: the same tokens and statistics."""
    model = ours_from_hf(tiny_hf_model("llama", seed=3)).model
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 3, 9, 3, 9, 3, 9]]
    cost = StepCost(tokens=[1, 8, 64], ms=[10.0, 10.5, 14.0], per_seq_ms=0.1, context=64)
    runs = []
    before = compiled.use_compiled(True)
    try:
        for on in (True, False):
            compiled.use_compiled(on)
            torch.manual_seed(0)
            plan = Planner(cost, PlannerConfig(learn_overhead=False))
            res = generate(model, prompts, make_proposer(method), max_new_tokens=24, planner=plan)
            runs.append([(r.output_ids, stats_of(r.stats)) for r in res])
    finally:
        compiled.use_compiled(before)
    assert runs[0] == runs[1]


class Learner(Proposer):
    """Keeps what each update saw (and when: the sequence's tokens at the call)."""

    def __init__(self):
        self.seen = []

    def update(self, state, outcome):
        self.seen.append((state.sid, list(state.tokens), outcome.path, list(outcome.rows.items()),
                          outcome.new_tokens, outcome.sent))


def settled(outcomes) -> list:
    return [(type(o), list(vars(o)), o.tree, o.path, o.new_tokens, o.logits, list(o.rows.items()), o.sent, o._top1,
             o._topk) for o in outcomes]


def greedy_walk(rng: random.Random, tree: StepTree) -> tuple:
    path = [0]
    while (kids := list(tree.children[path[-1]].values())) and rng.random() < 0.7:
        path.append(rng.choice(kids))
    return path, rng.randrange(40)


@pytest.mark.parametrize("seed", range(6))
def test_outcomes_settle_each_sequence_as_the_reference(glue, seed):
    rng = random.Random(seed)
    eos = {3, 7}
    for _ in range(30):
        B = rng.randrange(1, 5)
        trees = [random_tree(rng) for _ in range(B)]
        keep = None if rng.random() < 0.3 else [closed_subset(rng, t) for t in trees]
        sids = list(range(B))
        sent, rows, _ = send(sids, trees, keep)
        verdicts = [greedy_walk(rng, t) for t in sent]
        reduced = [(object(), [1, 2], [[1], [2]]) if rng.random() < 0.5 else (None, None, None) for _ in sids]
        runs = []
        for use in (glue, None):
            seqs = []
            for sid in sids:
                r = random.Random(sid * 7 + seed)
                prompt = [r.randrange(20) for _ in range(3)]
                seqs.append(Sequence(SeqState(sid, prompt + [r.randrange(20) for _ in range(r.randrange(4))], 3),
                                     r.randrange(1, 8)))
            learner = Learner()
            out = settle(learner, seqs, trees, sent, rows, verdicts, reduced, keep, eos, use)
            runs.append((settled(out), [(s.state.tokens, s.finish) for s in seqs], learner.seen))
        assert runs[0] == runs[1]
    assert glue.outcomes([], [], [], [], [], [], None, eos, Sequence, Outcome, None) == []


def test_outcomes_leave_other_sequences_to_the_reference_unchanged(glue):
    class Mine(Sequence):  # a sequence class of its own append
        def append(self, tokens, eos):
            return []

    t = StepTree.root(1)
    t.add_chain([2, 3], 1)
    sent, rows, _ = send([0], [t], None)
    for seq in (Mine(SeqState(0, [1], 1), 5), Sequence(SeqState(0, [1], 1), 5)):
        args = [[seq], [t], sent, rows, [([0, 1], 9)], [(None, None, None)], None, {3}, Sequence, Outcome, None]
        if type(seq) is Mine:
            assert glue.outcomes(*args) is None
        else:
            args[4] = [([0, 5], 9)]  # a path node outside the sent tree: the reference raises
            assert glue.outcomes(*args) is None
        assert seq.state.tokens == [1] and seq.finish is None


def test_send_leaves_a_tree_of_unequal_fields_to_the_reference(glue):
    from models.runner import StepInput

    t = StepTree.root(5)
    t.add_chain([1, 2], 1)
    t.candidate.append(True)  # one more candidate than tokens: logit_nodes counts the tokens
    assert glue.send([t], None, [0], StepTree, StepInput) is None
    assert send([0], [t], None, glue)[1] == [{0: 0, 1: 1, 2: 2}]


def test_the_glue_makes_only_plain_dataclasses_without_their_init():
    """compiled.maker: (class, fields) for a dataclass whose generated __init__ only assigns (the glue
    then sets the fields itself), the class where an __init__ of its own must run."""
    from dataclasses import dataclass, field

    @dataclass
    class Plain:
        a: int
        b: list = field(default_factory=list)
        c: int = field(default=0, init=False)

    @dataclass
    class Post(Plain):
        def __post_init__(self):
            self.c = 1

    @dataclass(frozen=True)
    class Frozen:
        a: int

    @dataclass(init=False)
    class Own:
        a: int

        def __init__(self, a):
            self.a = a + 1

    @dataclass
    class Factory:
        a: int
        b: list = field(default_factory=list, init=False)

    assert compiled.maker(Plain) == (Plain, ("a", "b", "c"))
    assert all(compiled.maker(c) is c for c in (Post, Frozen, Own, Factory, dict))
    assert compiled.maker(StepTree)[1][0] == "tokens" and compiled.maker(Outcome)[1][-2:] == ("_top1", "_topk")


def reduced_following(rng: random.Random, trees: list[StepTree], rows: list[dict]) -> list[tuple]:
    """Each row's argmax a child's token of its node most of the time (long accepted paths), else
    any token: what the step's reduction hands the greedy walk."""
    out = []
    for t, r in zip(trees, rows):
        top1 = [rng.randrange(50) for _ in r]
        for node, j in r.items():
            kids = list(t.children[node])
            if kids and rng.random() < 0.7:
                top1[j] = rng.choice(kids)
        out.append((None, top1, None))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_paths_walk_as_greedy_path(glue, seed):
    from decoding.verify import greedy_path

    rng = random.Random(seed)
    trees = [random_tree(rng) for _ in range(rng.randrange(1, 6))]
    keep = [closed_subset(rng, t) for t in trees]
    sent, rows, _ = send(list(range(len(trees))), trees, keep)
    reduced = reduced_following(rng, sent, rows)
    got = glue.paths(sent, rows, reduced)
    assert got == [greedy_path(t, r, top1) for t, r, (_, top1, _) in zip(sent, rows, reduced)]
    assert all(type(v) is tuple and type(v[0]) is list for v in got)


def test_paths_leave_what_they_do_not_take_to_the_reference(glue):
    rng = random.Random(3)
    t = StepTree.root(1)
    t.add_chain([2, 3], DRAFT)
    sent, rows, _ = send([0], [t], None)
    ok = [(None, [2, 3, 4], None)]
    assert glue.paths(sent, rows, ok) == [([0, 1, 2], 4)]
    for bad_rows, bad_reduced in (([{0: 0, 1: 1}], ok),  # node 2 has no row: the reference raises KeyError
                                  (rows, [(None, [2, 3], None)]),  # a row past top1
                                  (rows, [(None, None, None)]),  # sampling: no argmax
                                  ([list(rows[0].items())], ok)):
        assert glue.paths(sent, bad_rows, bad_reduced) is None
    assert glue.paths(sent, rows, ok + ok) is None and rng is not None
