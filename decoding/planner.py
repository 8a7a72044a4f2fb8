"""Cost-aware steps: each step sends the draft nodes whose expected gain pays for what they
cost on this device (docs/DESIGN.md, "Cost-aware steps: the planner").

Two measured things decide it. The device's cost of a forward as a function of the step
tokens of each sequence (``cost(step_tokens) -> ms``, e.g. ``models.cost.StepCost``), plus
the host's per-step overhead learned from wall time. And, per sequence, the chance that a
draft node is accepted given its parent was, per (source, depth, rank among siblings),
smoothed towards the batch's shared estimate and a prior. A node's expected gain is the
product of those chances along its path (its chance of being accepted). A lookahead window
column earns future tokens through the n-grams it harvests (credited when a node that only
the window's harvest proposed is accepted); it is worth ``window_rate`` tokens per column
and step.

Every candidate node and window column of the whole batch is ranked by expected tokens per
step token; the step takes the prefix of that ranking that maximises expected new tokens per
unit of predicted time (the batch's cost is that of its total tokens). Where nothing is
likely to be accepted, or tokens are dear, steps shrink to one token per sequence: plain
decoding, and never slower than it by the model's own estimate.
"""

from array import array
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

from decoding import compiled
from decoding.proposer import Outcome
from decoding.tree import DRAFT, HARVEST, RECYCLE, WINDOW, StepTree

# (step tokens of each sequence, their committed lengths or None) -> predicted ms of the forward;
# models.cost.StepCost is one, and a cost that ignores the lengths still takes them
CostFn = Callable[[list[int], Optional[list[int]]], float]

MAX_DEPTH_KEY = 8  # depths beyond share one estimate
MAX_RANK_KEY = 3  # so do sibling ranks (0 = the first child of its parent, e.g. the top-1 prediction)
# calibration (PlannerConfig.calibrate): pseudo tokens behind a ratio of 1, decay per sequence step
# (older steps fade), lowest factor
CAL_WEIGHT, CAL_DECAY, CAL_FLOOR = 3.0, 0.97, 0.3
# the least share of the curve's forward a step is predicted to take, whatever the learnt time beyond
# it says (a fit of a few noisy steps must not make steps look free)
MIN_OF_CURVE = 0.5


@dataclass(slots=True)
class PlannerConfig:
    prior: float = 0.4  # chance a draft node is accepted given its parent was, before any evidence
    prior_weight: float = 2.0  # pseudo-trials behind the prior (per key)
    decay: float = 0.97  # a sequence's older trials fade by this factor per new trial of the same key
    explore: float = 1.0  # optimism: plan with rate + explore * its standard error (few trials: try it)
    window_rate: float = 0.15  # tokens a lookahead window column earns per step, before evidence
    window_weight: float = 50.0  # pseudo column-steps behind window_rate
    max_tokens: int = 128  # most step tokens per sequence
    # most step tokens of the whole batch (None: no limit). With CUDA graphs a step of more rows
    # than the largest graph runs eagerly, an order of magnitude slower than a replay, which the
    # measured step-cost curve (batch 1, up to 64 tokens) cannot show: planner_for sets this to
    # the graphs' row limit
    max_step_tokens: Optional[int] = None
    # add what a step takes beyond the curve's forward (wall time - predicted forward), a + b x tokens: the
    # host's work, and the curve's error on the machine as it runs now (below zero where the forward runs
    # faster than the curve says; the step then still costs at least MIN_OF_CURVE of the curve)
    learn_overhead: bool = True
    # drafts are sent only when they promise this much more than a one-token step (tokens per unit
    # of predicted time): the cost model's error is a few percent, so a smaller promise can be a loss
    min_gain: float = 0.0
    # scale every node's chance by accepted / expected draft tokens of the batch's past steps when
    # that is below 1: the nodes a step sends are the ones whose estimates came out highest, so
    # those estimates run above what is accepted (most where tokens are dear and steps are small)
    calibrate: bool = True

    def __post_init__(self):
        if not 0.0 < self.prior < 1.0:
            raise ValueError(f"prior must be in (0, 1), got {self.prior}")
        if self.prior_weight <= 0:
            raise ValueError(f"prior_weight must be > 0, got {self.prior_weight}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {self.decay}")
        if self.window_rate < 0 or self.window_weight <= 0:
            raise ValueError(f"window_rate must be >= 0 and window_weight > 0, got {self.window_rate}, "
                             f"{self.window_weight}")
        if self.explore < 0:
            raise ValueError(f"explore must be >= 0, got {self.explore}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.max_step_tokens is not None and self.max_step_tokens < 1:
            raise ValueError(f"max_step_tokens must be >= 1 or None, got {self.max_step_tokens}")
        if not self.min_gain >= 0:
            raise ValueError(f"min_gain must be >= 0, got {self.min_gain}")


class Acceptance:
    """Smoothed acceptance chances by key (source bit, depth, rank); ``shared`` is the
    estimate a sequence's own evidence is smoothed towards (the batch's), else the prior."""

    def __init__(self, cfg: PlannerConfig, shared: "Acceptance | None" = None):
        self.cfg, self.shared = cfg, shared
        self.hits: dict[tuple, float] = {}
        self.trials: dict[tuple, float] = {}
        self.streak = False  # the sequence's last step accepted a draft token
        self.version = 0  # of the shared estimate: bumped by every record of any sequence
        self._memo: dict[tuple, tuple[float, float]] = {}  # key -> (rate, optimistic) at _memo_version
        self._memo_version = -1

    def _root(self) -> "Acceptance":
        return self if self.shared is None else self.shared

    def _rates(self, key: "AcceptKey") -> tuple[float, float]:
        """(rate, optimistic) of ``key``, memoised until the next record (the planner asks for
        the same few keys hundreds of times per step)."""
        version = self._root().version
        if version != self._memo_version:
            self._memo.clear()
            self._memo_version = version
        out = self._memo.get(key)
        if out is None:
            base = self.shared.rate(key) if self.shared is not None else self.cfg.prior
            w = self.cfg.prior_weight
            n = self.trials.get(key, 0.0) + w
            p = (self.hits.get(key, 0.0) + base * w) / n
            out = self._memo[key] = (p, min(p + self.cfg.explore * (p * (1 - p) / n) ** 0.5, 0.99))
        return out

    def rate(self, key: "AcceptKey") -> float:
        return self._rates(key)[0]

    def optimistic(self, key: "AcceptKey") -> float:
        """The rate plus ``explore`` standard errors: what the planner plans with, so that
        rarely tried drafts get tried (and learned) instead of being ruled out by the prior."""
        return self._rates(key)[1]

    def record(self, key: "AcceptKey", hit: bool) -> None:
        d = self.cfg.decay
        self.hits[key] = d * self.hits.get(key, 0.0) + hit
        self.trials[key] = d * self.trials.get(key, 0.0) + 1.0
        if self.shared is not None:
            self.shared.record(key, hit)
        else:
            self.version += 1


class ArrayAcceptance(Acceptance):
    """``Acceptance`` with its hits and trials in dense arrays (one slot per key:
    ``compiled.key_index``), which the compiled planner reads and writes in place; the same
    estimates as the dict's."""

    def __init__(self, cfg: PlannerConfig, shared: "ArrayAcceptance | None" = None):
        super().__init__(cfg, shared)
        self.hits, self.trials = array("d", bytes(8 * compiled.N_KEYS)), array("d", bytes(8 * compiled.N_KEYS))

    def _rates(self, key: "AcceptKey") -> tuple[float, float]:
        i = compiled.key_index(key)
        base = self.shared.rate(key) if self.shared is not None else self.cfg.prior
        w = self.cfg.prior_weight
        n = self.trials[i] + w
        p = (self.hits[i] + base * w) / n
        return p, min(p + self.cfg.explore * (p * (1 - p) / n) ** 0.5, 0.99)

    def record(self, key: "AcceptKey", hit: bool) -> None:
        i, d = compiled.key_index(key), self.cfg.decay
        self.hits[i] = d * self.hits[i] + hit
        self.trials[i] = d * self.trials[i] + 1.0
        if self.shared is not None:
            self.shared.record(key, hit)


def _total(xs) -> float:
    """The sum of ``xs`` added left to right, as the compiled twin adds (``sum`` of floats
    compensates its rounding from Python 3.12 on)."""
    out = 0.0
    for x in xs:
        out += x
    return out


# whether the model's own earlier prediction (a recycled top-k token, decoding/recycle.py) backs a
# first draft token: its siblings hold none (no opinion), it is one of them (backed), or only others
# are (not backed). On suite prompts a copied first token (prompt lookup, pool, suffix) that the
# recycled table did not back was accepted far less often than a backed one, and without the key
# the planner sent both on one estimate. Deeper tokens are keyed without it: there the split cost
# more in estimates learned from fewer trials than it told (docs/DESIGN.md, the planner).
NO_OPINION, BACKED, NOT_BACKED = 2, 1, 0
BACKED_DEPTH = 1  # deepest node whose key says whether it is backed


class AcceptKey(NamedTuple):
    """What one acceptance estimate is kept for (``Acceptance``): a candidate node's source bit,
    its depth and its rank among its siblings (both capped), whether the sequence's last step
    accepted a draft token, and whether a recycled prediction backs it."""

    bit: int
    depth: int
    rank: int
    streak: bool
    backed: int


class Item(NamedTuple):
    """One thing ``Planner.select`` may add to a step: a candidate node or a window group."""

    order_value: float  # minus expected new tokens per unit of added time: sorted ascending
    order: tuple  # ties: shallower nodes and lower groups first (every prefix stays closed under parents)
    seq: int  # which tree of the batch
    value: float  # expected new tokens
    tokens: int  # step tokens it adds
    nodes: tuple  # the tree nodes it adds


def node_keys(tree: StepTree, node: int, streak: bool = False) -> list[AcceptKey]:
    """The estimate keys of a candidate node: one per source bit it carries, with its depth,
    its rank among its siblings, whether the sequence's last step accepted a draft
    (acceptance comes in streaks: a copied passage goes on being copied) and, for a first
    draft token, whether a recycled prediction backs it (``NO_OPINION``, ``BACKED``,
    ``NOT_BACKED``: a copied token the model did not predict after the same token before is
    seldom accepted)."""
    parent = tree.parents[node]
    kids = tree.children[parent]
    rank = min(list(kids.values()).index(node), MAX_RANK_KEY)
    depth = min(tree.depths[node], MAX_DEPTH_KEY)
    bits = tree.sources[node] & ~WINDOW
    sources, candidate = tree.sources, tree.candidate
    opinion = depth <= BACKED_DEPTH and any(candidate[c] and sources[c] & RECYCLE for c in kids.values())
    backed = _backing(bits, depth, opinion)
    return [AcceptKey(bit, depth, rank, streak, backed) for bit in _bits(bits)]


def _backing(bits: int, depth: int, opinion: bool) -> int:
    """The backing part of a node's keys: ``opinion`` = a recycled prediction is among the
    candidate children of its parent."""
    if not opinion or depth > BACKED_DEPTH:
        return NO_OPINION
    return BACKED if bits & RECYCLE else NOT_BACKED


def _bits(x: int) -> list[int]:
    return [1 << i for i in range(x.bit_length()) if x >> i & 1]


def node_probs(tree: StepTree, acc: Acceptance, optimistic: bool = False) -> list[float]:
    """Each node's chance of being accepted (root 1; private nodes 0), from the estimates or
    from their optimistic bounds."""
    rate, opt = node_estimates(tree, acc)
    return opt if optimistic else rate


def node_estimates(tree: StepTree, acc: Acceptance) -> tuple[list[float], list[float]]:
    """``node_probs`` from the estimates and from their optimistic bounds, in one pass."""
    n_nodes = len(tree)
    rank = [0] * n_nodes  # among its siblings (children are kept in rank order)
    for kids in tree.children:
        for r, c in enumerate(kids.values()):
            rank[c] = r
    p, q = [1.0] + [0.0] * (n_nodes - 1), [1.0] + [0.0] * (n_nodes - 1)
    left_p, left_q = [1.0] * n_nodes, [1.0] * n_nodes  # per parent: chance none of its earlier children is the token
    rates, streak, chance = acc._rates, acc.streak, tree.chance
    seen: dict[tuple, tuple[float, float]] = {}
    parents, depths, sources, candidate = tree.parents, tree.depths, tree.sources, tree.candidate
    opinion = [False] * n_nodes  # per parent: a recycled prediction is among its candidate children
    for n in range(1, n_nodes):
        if candidate[n] and sources[n] & RECYCLE:
            opinion[parents[n]] = True
    for n in range(1, n_nodes):  # parents come before children, siblings in rank order
        if not candidate[n]:
            continue
        parent = parents[n]
        bits = sources[n] & ~WINDOW
        backed = _backing(bits, depths[n], opinion[parent])
        depth, r = min(depths[n], MAX_DEPTH_KEY), min(rank[n], MAX_RANK_KEY)
        key = (bits, depth, r, backed)
        est = seen.get(key)
        if est is None:  # nodes of a tree share a few keys
            est_p = est_q = 0.0
            for bit in _bits(bits):
                a, b = rates(AcceptKey(bit, depth, r, streak, backed))
                est_p, est_q = max(est_p, a), max(est_q, b)
            est = seen[key] = (est_p, est_q)
        est_p, est_q = est
        if n in chance:  # the proposer's own estimate (e.g. a draft model's calibrated confidence)
            c = chance[n]
            est_p, est_q = (c, c) if sources[n] == DRAFT else (max(est_p, c), max(est_q, c))
        # siblings exclude each other (one next token): their chances sum to at most 1
        cond = min(est_p, left_p[parent])
        left_p[parent] -= cond
        p[n] = p[parent] * cond
        cond = min(est_q, left_q[parent])
        left_q[parent] -= cond
        q[n] = q[parent] * cond
    return p, q


def _closed(tree: StepTree, nodes: set[int]) -> set[int]:
    """``nodes`` and their ancestors, the root excluded."""
    out = set()
    for n in nodes:
        while n > 0 and n not in out:
            out.add(n)
            n = tree.parents[n]
    return out


class Planner:
    """One per generate call. ``budgets`` before proposing, ``select`` after, ``observe`` after
    each step."""

    def __init__(self, cost: CostFn, cfg: PlannerConfig | None = None):
        self.cost, self.cfg = cost, cfg or PlannerConfig()
        self.contexts: Optional[list[int]] = None  # of the batch being planned
        # the compiled twin of max_depth / select / observe (decoding/compiled.py), or None: these
        # methods' Python bodies below are its reference
        self._core = compiled.planner_core(cost)
        self._Acc = ArrayAcceptance if self._core is not None else Acceptance
        self.shared = self._Acc(self.cfg)
        self.seq_acc: dict[int, Acceptance] = {}
        self.window_credit = 0.0  # accepted tokens only the window's harvest proposed
        self.window_columns = 0  # window columns sent
        # a step's time beyond the curve's forward at the mean step size seen (the host's work, plus the
        # curve's error now: may be below zero), and what each step token adds to it (>= 0: trees cost host work)
        self.overhead_ms = 0.0
        self.overhead_per_token = 0.0
        self._cal = [0.0, 0.0]  # decayed sums over sequence steps: expected and accepted draft tokens
        self._sent_expect: dict[int, float] = {}  # per sequence: expected draft tokens of what it sent
        self._ovh = [0.0] * 5  # decayed sums: weight, x, y, xx, xy (x = step tokens, y = wall - forward)
        # bumped by whatever changes what the compiled calls read besides the estimates' arrays (a
        # sequence's streak, the learnt host time): their cue to bring their structures up to date
        self.version = 0
        # for the benchmark: totals over the steps (seq_steps = sequences x steps)
        self.log = dict(steps=0, seq_steps=0, step_tokens=0, expected_tokens=0.0, new_tokens=0,
                        predicted_ms=0.0, measured_ms=0.0, one_token_ms=0.0)
        # ``calibration`` and ``window_rate`` as of the last step, for the compiled calls: set where
        # their sums change, so that a step reads two numbers rather than calls two properties
        self._calibration, self._window_rate = self.calibration, self.window_rate
        # the proposer's sources as the step's max_depth had them (None: not planned by max_depth), and
        # the next step's depths where observe_step planned them: (sids, sources, contexts, depths,
        # version), or None
        self._sources: Optional[int] = None
        self._next: Optional[tuple] = None

    # ---- estimates --------------------------------------------------------------------------
    def acceptance(self, sid: int) -> Acceptance:
        if sid not in self.seq_acc:
            self.seq_acc[sid] = self._Acc(self.cfg, self.shared)
        return self.seq_acc[sid]

    @property
    def calibration(self) -> float:
        """Accepted over expected draft tokens of the steps so far (decayed per sequence step,
        smoothed towards 1 by ``CAL_WEIGHT`` tokens), at most 1 and at least ``CAL_FLOOR``: what
        the planner multiplies every node's chance by (1 with ``calibrate`` off)."""
        if not self.cfg.calibrate:
            return 1.0
        expected, accepted = self._cal
        return min(1.0, max(CAL_FLOOR, (accepted + CAL_WEIGHT) / (expected + CAL_WEIGHT)))

    @property
    def window_rate(self) -> float:
        c = self.cfg
        return (self.window_credit + c.window_rate * c.window_weight) / (self.window_columns + c.window_weight)

    def _cost(self, tokens: list[int]) -> float:
        contexts = self.contexts if self.contexts is not None and len(self.contexts) == len(tokens) else None
        return self.cost(tokens, contexts)

    def _time(self, tokens: list[int]) -> float:
        """Predicted ms of the step (forward, plus the learnt host time); infinite past
        ``max_step_tokens``, so that no plan sends such a step."""
        if self.cfg.max_step_tokens is not None and sum(tokens) > self.cfg.max_step_tokens:
            return float("inf")
        if not self.cfg.learn_overhead:
            return self._cost(tokens)
        ms = self._cost(tokens)
        extra = self.overhead_ms + self.overhead_per_token * (sum(tokens) - self._mean_x)
        return max(MIN_OF_CURVE * ms, ms + extra)

    @property
    def _mean_x(self) -> float:
        return self._ovh[1] / self._ovh[0] if self._ovh[0] > 0 else 0.0

    # ---- before proposing -------------------------------------------------------------------
    def max_depth(self, sids: list[int], sources: int, contexts: Optional[list[int]] = None) -> list[int]:
        """Per sequence, the deepest chain of the proposer's ``sources`` worth verifying if
        the rest of the batch sent one token each: the depth that maximises expected tokens
        per unit of time along the best chain (rank 0, the best source at each depth).
        ``contexts``: the sequences' committed lengths, for a cost that depends on them (they
        hold for this step's ``select`` and ``observe_time`` too; a new list each step: the
        compiled cost keeps its copy of the last list it was given). Where the last
        ``observe_step`` planned this step in its call (these sequences, sources and contexts, the
        planner unchanged since), its answer."""
        nx = self._next
        if nx is not None:
            self._next = None
            if nx[4] == self.version and nx[1] == sources and nx[0] == sids and nx[2] == contexts:
                self.contexts = nx[2]  # the list the compiled structures were left ready with
                return nx[3]
        self.contexts, self._sources = contexts, sources
        if self._core is not None and (out := self._core.max_depth(self, sids, sources)) is not None:
            return out
        bits = _bits(sources & ~WINDOW) or [0]
        # the best chain's nodes may be backed by a recycled prediction only if the proposer has them
        opinions = (NO_OPINION, BACKED) if sources & RECYCLE else (NO_OPINION,)
        out = []
        for b, sid in enumerate(sids):
            acc, tokens = self.acceptance(sid), [1] * len(sids)
            # chance of depth d given d - 1 along the best chain (rank 0, the best source); depths
            # from MAX_DEPTH_KEY on share one
            qs = [max(acc.optimistic(AcceptKey(bit, d, 0, acc.streak, backed)) for bit in bits
                      for backed in (opinions if d <= BACKED_DEPTH else (NO_OPINION,)))
                  for d in range(1, MAX_DEPTH_KEY + 1)]
            best, best_d, p, gain = len(sids) / self._time(tokens) * (1 + self.cfg.min_gain), 0, 1.0, float(len(sids))
            c = self.calibration
            for d in range(1, self.cfg.max_tokens):
                q = qs[min(d, MAX_DEPTH_KEY) - 1]
                p *= q
                gain += c * p
                tokens[b] += 1
                t = self._time(tokens)
                if gain / t > best:
                    best, best_d = gain / t, d
                if p < 1e-3:
                    break
                # deeper chains add at most p q / (1 - q) tokens (q < 1: optimistic rates stop at 0.99)
                # and take no less time: none can win
                if d >= MAX_DEPTH_KEY and (gain + p * q / (1.0 - q)) / t <= best:
                    break
            out.append(best_d)
        return out

    def step_times(self, sids: list[int], contexts: Optional[list[int]] = None) -> list[Callable[[int], float]]:
        """Per sequence, predicted ms of the step (forward + host) if it sends n step tokens and
        the rest of the batch one each: for a proposer that sizes its own drafts."""
        self.contexts, self._sources = contexts, None

        def at(b: int) -> Callable[[int], float]:
            return lambda n: self._time([1] * b + [n] + [1] * (len(sids) - b - 1))
        return [at(b) for b in range(len(sids))]

    # ---- after proposing --------------------------------------------------------------------
    def select(self, sids: list[int], trees: list[StepTree]) -> list[list[int]]:
        """Per tree, the nodes to send (increasing, root first, closed under parents)."""
        if self._core is not None:
            pinned = []  # a plain loop: a comprehension is a call of its own (decode_step)
            for tree in trees:
                pinned.append(sorted(_closed(tree, tree.pinned)) if tree.pinned else [])
            done = self._core.select(self, sids, trees, pinned)
            if done is not None:
                chosen, expected = done
                log, sent = self.log, self._sent_expect
                for sid, e in zip(sids, expected):  # _log_expected, written out (a call costs: compiled.py)
                    log["expected_tokens"] += e
                    sent[sid] = e - 1.0
                return chosen
        wrate = self.window_rate
        estimates = [node_estimates(tree, self.acceptance(sid)) for sid, tree in zip(sids, trees)]
        c = self.calibration
        all_probs = [opt if c == 1.0 else [1.0] + [x * c for x in opt[1:]] for _, opt in estimates]
        pinned = [sorted(_closed(tree, tree.pinned)) for tree in trees]  # sent whatever they cost
        # rank by expected tokens per unit of added time: a token costs more in a sequence over a
        # longer prefix when the cost knows the committed lengths (else every unit is the same)
        ones = [1] * len(trees)
        base = self._cost(ones)
        unit = [max(1e-6, self._cost(ones[:b] + [2] + ones[b + 1:]) - base) for b in range(len(trees))]
        items: list[Item] = []
        for b, (tree, probs) in enumerate(zip(trees, all_probs)):
            u, pin, depths, candidate, group = unit[b], set(pinned[b]), tree.depths, tree.candidate, tree.group
            groups: dict[int, list[int]] = {}
            for n in range(1, len(tree)):
                if candidate[n]:
                    if n not in pin:
                        items.append(Item(-probs[n] / u, (0, depths[n], n), b, probs[n], 1, (n,)))
                elif group[n] >= 0:
                    groups.setdefault(group[n], []).append(n)
            for g, nodes in groups.items():
                items.append(Item(-wrate / (len(nodes) * u), (1, g, 0), b, wrate, len(nodes), tuple(nodes)))
        items.sort(key=lambda it: (it.order_value, it.order, it.seq))
        tokens = [1 + len(p) for p in pinned]
        gain = len(trees) + _total(probs[n] for p, probs in zip(pinned, all_probs) for n in p)
        best, best_k = gain / self._time(tokens) * (1 + self.cfg.min_gain), 0
        taken = []
        rest = _total(it.value for it in items)  # gain the items not yet looked at could still add
        max_tokens = self.cfg.max_tokens
        for it in items:
            b, value, add = it.seq, it.value, it.tokens
            rest -= value
            if tokens[b] + add > max_tokens:
                continue
            tokens[b] += add
            gain += value
            taken.append(it)
            t = self._time(tokens)
            r = gain / t
            if r > best:
                best, best_k = r, len(taken)
            elif (gain + rest) / t <= best:  # step time grows with tokens: no longer prefix can win
                break
        keep = [[0] + p for p in pinned]
        for it in taken[:best_k]:
            keep[it.seq] += it.nodes
        chosen = [sorted(k) for k in keep]
        for sid, (probs, _), k in zip(sids, estimates, chosen):
            self._log_expected(sid, _total(probs[n] for n in k))  # the root's 1 included
        return chosen

    def _log_expected(self, sid: int, expected: float) -> None:
        self.log["expected_tokens"] += expected
        self._sent_expect[sid] = expected - 1.0

    # ---- after the step ---------------------------------------------------------------------
    def observe(self, sid: int, outcome: Outcome) -> None:
        """Learn from one sequence's step: trials for every sent candidate whose parent was
        accepted; window credit and cost."""
        tree, acc, on_path = outcome.tree, self.acceptance(sid), set(outcome.path)
        if self._core is not None:
            credit, columns = self._core.observe(self, acc, outcome)
            self.window_credit += credit
            self.window_columns += columns
        else:
            self._observe_ref(tree, acc, on_path, outcome)
        self._window_rate = self.window_rate
        self._learn_step(sid, acc, outcome)

    def observe_all(self, sids: list[int], outcomes: list[Outcome]) -> None:
        """``observe`` for every sequence of a step, in one compiled call where the outcomes are
        of the trees the last ``select`` saw."""
        done = self._core.observe_all(self, sids, outcomes) if self._core is not None else None
        if done is None:
            for sid, outcome in zip(sids, outcomes):
                self.observe(sid, outcome)
            return
        self.window_credit += done[0]
        self.window_columns += done[1]
        c = self.cfg  # window_rate, written out (a call costs: compiled.py)
        self._window_rate = (self.window_credit + c.window_rate * c.window_weight) / (self.window_columns
                                                                                      + c.window_weight)
        seq_acc, sent, cal, calibrate = self.seq_acc, self._sent_expect, self._cal, c.calibrate
        for sid, outcome in zip(sids, outcomes):  # _learn_step, written out
            accepted = len(outcome.path) - 1
            (seq_acc[sid] if sid in seq_acc else self.acceptance(sid)).streak = accepted > 0
            self.version += 1
            expected = sent.pop(sid, 0.0)
            if expected > 0:
                cal[0] = CAL_DECAY * cal[0] + expected
                cal[1] = CAL_DECAY * cal[1] + accepted
                if calibrate:
                    self._calibration = min(1.0, max(CAL_FLOOR, (cal[1] + CAL_WEIGHT) / (cal[0] + CAL_WEIGHT)))

    def observe_step(self, sids: list[int], outcomes: list[Outcome], step_tokens: list[int], wall_ms: float,
                     new_tokens: int, model_ms: float = 0.0) -> None:
        """A whole step learnt: ``observe_all(sids, outcomes)`` then ``observe_time(step_tokens,
        wall_ms, new_tokens, model_ms)``, in one compiled call where the outcomes are of the trees
        the last ``select`` saw (the two methods are its reference: tests/test_compiled.py). Why
        one call: a step's Python calls each pay their lines from memory after a forward, and these
        two were a sixth of a planned step's host time (bench/results/2026-11-28-cpu-elementwise/
        NOTES.md)."""
        if self._core is not None:
            c = self.cfg
            done = self._core.observe_step(self, sids, outcomes, step_tokens, wall_ms, new_tokens, model_ms,
                                           (CAL_DECAY, CAL_WEIGHT, CAL_FLOOR, c.window_rate, c.window_weight,
                                            c.calibrate), self._sources)
            if done is not None:
                if done is not True:  # the next step's depths, planned in the same call
                    self._next = (list(sids), self._sources, done[1], done[0], self.version)
                return
        self.observe_all(sids, outcomes)
        self.observe_time(step_tokens, wall_ms, new_tokens, model_ms)

    def _learn_step(self, sid: int, acc: Acceptance, outcome: Outcome) -> None:
        """After a sequence's trials: its streak and the calibration of what its step promised."""
        accepted = len(outcome.path) - 1  # outcome.accepted, written out
        acc.streak = accepted > 0
        self.version += 1
        expected = self._sent_expect.pop(sid, 0.0)
        if expected > 0:  # steps that sent drafts: what their estimates promised against what came
            cal = self._cal
            cal[0] = CAL_DECAY * cal[0] + expected
            cal[1] = CAL_DECAY * cal[1] + accepted
            if self.cfg.calibrate:  # calibration, written out
                self._calibration = min(1.0, max(CAL_FLOOR, (cal[1] + CAL_WEIGHT) / (cal[0] + CAL_WEIGHT)))

    def _observe_ref(self, tree: StepTree, acc: Acceptance, on_path: set[int], outcome: Outcome) -> None:
        for n in outcome.rows:
            if n == 0 or not tree.candidate[n] or tree.parents[n] not in on_path:
                continue
            for key in node_keys(tree, n, acc.streak):
                acc.record(key, n in on_path)
            if n in on_path and tree.sources[n] == HARVEST:
                self.window_credit += 1
        self.window_columns += len({tree.group[n] for n in outcome.rows if not tree.candidate[n]
                                    and tree.group[n] >= 0})

    def observe_time(self, step_tokens: list[int], wall_ms: float, new_tokens: int, model_ms: float = 0.0) -> None:
        """The whole step took ``wall_ms`` (propose to update) and gained ``new_tokens``;
        ``model_ms`` of it the proposer spent running its own model (a draft model: it sizes
        and accounts for that itself, so it is not host overhead)."""
        if self._core is not None:  # both costs from its tables, in one call
            contexts = self.contexts if self.contexts is not None and len(self.contexts) == len(step_tokens) else None
            predicted, one_token = self._core.forward_ms(step_tokens, contexts)
        else:
            predicted, one_token = self._cost(step_tokens), self._cost([1] * len(step_tokens))
        # host time = a + b x step tokens, fitted by decayed least squares (recent steps count most)
        x, y, o = float(sum(step_tokens)), wall_ms - model_ms - predicted, self._ovh
        for i, v in enumerate((1.0, x, y, x * x, x * y)):
            o[i] = 0.9 * o[i] + v
        mx, my = o[1] / o[0], o[2] / o[0]
        var = o[3] / o[0] - mx * mx
        self.overhead_per_token = max(0.0, (o[4] / o[0] - mx * my) / var) if var > 1.0 else 0.0
        self.overhead_ms = my
        self.version += 1
        log = self.log
        log["steps"] += 1
        log["seq_steps"] += len(step_tokens)
        log["step_tokens"] += sum(step_tokens)
        log["new_tokens"] += new_tokens
        log["predicted_ms"] += predicted + model_ms
        log["measured_ms"] += wall_ms
        log["one_token_ms"] += one_token
