"""The machinery of the sampling-exactness tests, shared by the tests and by the script that
measures their error rates (tests/sampling_power.py).

* ``World``: a synthetic target over a vocabulary of ``V`` tokens: every context (the tokens
  emitted so far) has its own fixed random logits, with one token favoured so that drafts along
  it are often accepted. No model: a verifier's step costs microseconds.
* ``generate_world``: L tokens emitted by steps of one verifier (``KINDS``): a token tree of
  one-hot chains through ``decoding.verify.verify``, a draft model's chain drawn from its own
  distribution q (``verify_draft_model``), or both in one trie (``verify_mixed``).
* ``exact_step_law``: one verifier step's exact output distribution, by running its own code
  over every branch of its randomness (``decoding.verify._uniform`` and ``sample`` replaced by
  symbolic draws), with no sampling error: compared with the target to ~1e-6.
* ``exactness_pvalues``: the statistical test of sampled outputs against the target: for each
  depth, the token's conditional distribution given each prefix seen often enough (Pearson
  chi-square, at most V cells per prefix, the prefixes' statistics summed), plus a pooled
  chi-square over the whole joint (for shifts spread over many rare outcomes). A run fails
  when any p-value is below ALPHA / number of tests (Bonferroni), so the false-failure rate of
  a whole run is at most ALPHA (as far as the chi-square approximation holds: measured).
"""

import itertools
import math
from typing import Callable

import torch

import decoding.verify as verify_mod
from decoding.sampling import SamplingParams, probs_from_logits
from decoding.tree import DRAFT, PLD, POOL, StepTree

V = 5  # vocabulary
L = 5  # tokens per generated sequence: depths 1 .. 5, past one step's draft
ALPHA = 1e-3  # false-failure rate of one test run (all its p-values together)
KINDS = ("tree", "draft", "mixed")
SETTINGS = {
    "t1": SamplingParams(temperature=1.0),
    "t0.9-topk4-topp0.85": SamplingParams(temperature=0.9, top_k=4, top_p=0.85),
}


_REFERENCE_MEMO: dict = {}


class World:
    """Fixed random logits for every context; ``q`` the draft model's (other) logits."""

    def __init__(self, seed: int = 0, boost: float = 2.2, noise: float = 0.6, draft_noise: float = 1.0):
        self.seed, self.boost, self.noise, self.draft_noise = seed, boost, noise, draft_noise
        self._p: dict = {}
        self._q: dict = {}

    def _gen(self, ctx: tuple, salt: int) -> torch.Generator:
        code = 0
        for t in ctx:
            code = code * (V + 1) + t + 1
        return torch.Generator().manual_seed((self.seed * 7919 + salt) * 1_000_003 + code)

    def logits(self, ctx: tuple) -> torch.Tensor:
        """(V,) float64 target logits after ``ctx``: one favoured token (by ``boost``)."""
        if ctx not in self._p:
            g = self._gen(ctx, 0)
            z = self.noise * torch.randn(V, generator=g, dtype=torch.float64)
            z[int(torch.randint(0, V, (1,), generator=g))] += self.boost
            self._p[ctx] = z
        return self._p[ctx]

    def draft_logits(self, ctx: tuple) -> torch.Tensor:
        """The draft model's logits: the target's plus noise (a draft that is often, not always, right)."""
        if ctx not in self._q:
            self._q[ctx] = self.logits(ctx) + self.draft_noise * torch.randn(V, generator=self._gen(ctx, 1),
                                                                             dtype=torch.float64)
        return self._q[ctx]

    def favoured(self, ctx: tuple) -> int:
        return int(self.logits(ctx).argmax())

    def favoured_path(self, n: int = L) -> tuple:
        ctx = ()
        for _ in range(n):
            ctx += (self.favoured(ctx),)
        return ctx


def _rank(world: World, ctx: tuple, r: int) -> int:
    return int(world.logits(ctx).argsort(descending=True)[r])


def _chain(world: World, ctx: tuple, first: int, n: int) -> list[int]:
    """``first`` then the favoured continuation: ``n`` tokens."""
    out = [first]
    while len(out) < n:
        out.append(world.favoured(ctx + tuple(out)))
    return out[:n]


def _draw(probs: torch.Tensor, gen) -> int:
    return int(verify_mod.sample(probs, gen))


def step(kind: str, world: World, ctx: tuple, sp: SamplingParams, gen, depth: int) -> list[int]:
    """One verification step after ``ctx``, drafting at most ``depth`` tokens: the emitted tokens."""
    if kind == "tree":
        t = StepTree.root(ctx[-1] if ctx else 0)
        if depth:
            main = _chain(world, ctx, world.favoured(ctx), depth)
            t.add_chain(main, PLD)
            t.add_chain(_chain(world, ctx, _rank(world, ctx, 1), min(2, depth)), POOL)  # a second root child
            if depth >= 2:  # and a second child under the first node
                t.add_chain([main[0]] + _chain(world, ctx + (main[0],), _rank(world, ctx + (main[0],), 1), 1), POOL)
        nodes = [n for n in range(len(t)) if t.candidate[n]]
        ctxs = [ctx + tuple(t.tokens[m] for m in _path(t, n)) for n in nodes]
        logits = torch.stack([world.logits(c) for c in ctxs])
        path, bonus = verify_mod.verify(t, logits, {n: j for j, n in enumerate(nodes)}, sp, gen)
        return [t.tokens[n] for n in path[1:]] + [bonus]
    # the draft model's chain, drawn from its own distribution q
    chain, qs = [], []
    for _ in range(depth):
        q = probs_from_logits(world.draft_logits(ctx + tuple(chain))[None], sp)[0]
        qs.append(q)
        chain.append(_draw(q, gen))
    if kind == "draft":
        p = probs_from_logits(torch.stack([world.logits(ctx + tuple(chain[:i])) for i in range(depth + 1)]), sp)
        n, nxt = verify_mod.verify_draft_model(chain, p, torch.stack(qs) if qs else p[:0], gen)
        return chain[:n] + [nxt]
    assert kind == "mixed"
    t = StepTree.root(ctx[-1] if ctx else 0)
    if depth:
        t.add_chain(chain, DRAFT)
        t.add_chain(_chain(world, ctx, world.favoured(ctx), depth), PLD)  # merged where it agrees with the draft
    probs = {n: probs_from_logits(world.logits(ctx + tuple(t.tokens[m] for m in _path(t, n)))[None], sp)[0]
             for n in range(len(t))}
    path, bonus = verify_mod.verify_mixed(t, probs, torch.stack(qs) if qs else None, gen)
    return [t.tokens[n] for n in path[1:]] + [bonus]


def _path(t: StepTree, n: int) -> list[int]:
    """Nodes from below the root down to ``n``."""
    out = []
    while n > 0:
        out.append(n)
        n = t.parents[n]
    return out[::-1]


def generate_world(kind: str, world: World, sp: SamplingParams, gen, length: int = L, max_draft: int = 4) -> tuple:
    """``length`` tokens emitted by steps of ``kind`` (each drafting up to ``max_draft``, and never
    past the end: a step emits its drafts plus one)."""
    out: list[int] = []
    while len(out) < length:
        out += step(kind, world, tuple(out), sp, gen, min(max_draft, length - len(out) - 1))
    assert len(out) == length
    return tuple(out)


def target_joint(world: World, sp: SamplingParams, reference: Callable, length: int = L, after: tuple = ()
                 ) -> torch.Tensor:
    """(V,) * length float64: the target's joint law of the ``length`` tokens after ``after``,
    from ``reference(logits list, temperature, top_k, top_p)`` (the independent reference)."""
    joint = torch.zeros((V,) * length, dtype=torch.float64)
    memo = _REFERENCE_MEMO.setdefault((id(world), id(reference), repr(sp)), {})

    def walk(ctx: tuple, prob: float):
        if len(ctx) == len(after) + length:
            joint[ctx[len(after):]] = prob
            return
        if ctx not in memo:
            memo[ctx] = reference(world.logits(ctx).tolist(), sp.temperature, sp.top_k, sp.top_p)
        p = memo[ctx]
        for x in range(V):
            if p[x] > 0:
                walk(ctx + (x,), prob * p[x])

    walk(tuple(after), 1.0)
    return joint


# ---- the exact law of a verifier, through its own code ------------------------------------------

class _Script:
    """Decisions for one replay of the verifier; records the branch points past the script."""

    def __init__(self, decisions: list[int]):
        self.decisions, self.i = decisions, 0
        self.options: list[int] = []  # number of options at each branch point of this run
        self.prob = 1.0

    def choose(self, weights: list[float]) -> int:
        live = [j for j, w in enumerate(weights) if w > 0]
        if len(live) == 1:  # no branch: the only possible outcome
            return live[0]
        if self.i < len(self.decisions):
            j = self.decisions[self.i]
        else:
            j = 0
        self.options.append(len(live))
        self.i += 1
        self.prob *= weights[live[j]] / sum(weights)
        return live[j]


class SymbolicUniform:
    """A U[0, 1) draw known only as an interval; every comparison splits it (each side with its
    length's probability), so a draw compared twice keeps its earlier answers."""

    def __init__(self, script: _Script):
        self.script, self.lo, self.hi = script, 0.0, 1.0

    def _split(self, t: float, below: bool) -> bool:
        t = min(max(float(t), self.lo), self.hi)
        side = self.script.choose([t - self.lo, self.hi - t])  # 0: below t
        if side == 0:
            self.hi = t
        else:
            self.lo = t
        return (side == 0) == below

    def __lt__(self, t):
        return self._split(t, True)

    def __ge__(self, t):
        return self._split(t, False)

    def __le__(self, t):
        return self._split(t, True)

    def __gt__(self, t):
        return self._split(t, False)

    def __float__(self):
        raise TypeError("a symbolic uniform has no value; the verifier must only compare it")


def enumerate_law(run: Callable[[], object], max_leaves: int = 100_000) -> dict:
    """{output: probability} of ``run()``, exactly: ``run`` is replayed once per branch of
    ``decoding.verify``'s randomness (``_uniform`` draws, compared symbolically, and ``sample``'s
    categorical draws), each replay taking the next untried branch."""
    import pytest

    law: dict = {}
    state: dict = {}
    decisions: list[int] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(verify_mod, "_uniform", lambda generator: SymbolicUniform(state["script"]))
        mp.setattr(verify_mod, "sample",
                   lambda probs, generator: state["script"].choose([float(x) for x in probs.double()]))
        for _ in range(max_leaves):
            script = state["script"] = _Script(decisions)
            out = run()
            law[out] = law.get(out, 0.0) + script.prob
            # the next leaf: advance the last branch point that has options left (an odometer)
            taken = decisions + [0] * (len(script.options) - len(decisions))
            while taken and taken[-1] + 1 >= script.options[len(taken) - 1]:
                taken.pop()
            if not taken:
                return law
            decisions = taken[:-1] + [taken[-1] + 1]
    raise AssertionError(f"more than {max_leaves} branches: make the case smaller")


def exact_step_law(kind: str, world: World, sp: SamplingParams, reference: Callable, ctx: tuple = (),
                   depth: int = 4) -> torch.Tensor:
    """(V,) * (depth + 1): the exact law of the next ``depth + 1`` tokens after ``ctx`` when one
    step of ``kind`` (drafting up to ``depth`` tokens) emits the first ones and the target itself
    the rest, through the verifier's own code (``enumerate_law``: the draft's draws, the uniforms
    and the categorical draws). An exact verifier gives the target's law of those tokens."""
    n = depth + 1
    law = torch.zeros((V,) * n, dtype=torch.float64)
    for emitted, prob in enumerate_law(lambda: tuple(step(kind, world, ctx, sp, None, depth))).items():
        rest = target_joint(world, sp, reference, n - len(emitted), ctx + emitted) if len(emitted) < n else 1.0
        law[emitted] += prob * rest
    return law


# ---- the statistical test ------------------------------------------------------------------------

def _chi2(counts: torch.Tensor, probs: torch.Tensor, pool_below: float) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom; cells expecting < ``pool_below`` are pooled
    into one. A count where the target has no mass gives an infinite statistic."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    n = counts.sum()
    if n == 0 or probs.sum() <= 0:
        return 0.0, 0
    probs = probs / probs.sum()
    if bool((counts[probs == 0] > 0).any()):
        return math.inf, 1
    exp = probs * n
    big, small = exp >= pool_below, (exp < pool_below) & (probs > 0)
    e = torch.cat([exp[big], exp[small].sum()[None]])
    o = torch.cat([counts[big], counts[small].sum()[None]])
    keep = e > 0
    return float(((o[keep] - e[keep]) ** 2 / e[keep]).sum()), int(keep.sum()) - 1


def _pvalue(stat: float, dof: int) -> float:
    if dof < 1:
        return 1.0 if stat < math.inf else 0.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor, pool_below: float = 5.0) -> float:
    """Pearson chi-square goodness of fit of ``counts`` to ``probs``."""
    return _pvalue(*_chi2(counts, probs, pool_below))


MIN_PREFIX = 40  # a prefix seen fewer times is left to the joint test (its cells would be mostly pooled)


def conditionals(target: torch.Tensor) -> list[torch.Tensor]:
    """[d]: (V,) * (d + 1), P(x_{d+1} | x_1 .. x_d) (zero where the prefix is impossible)."""
    length, out = target.dim(), []
    for d in range(length):
        upto = target.sum(dim=tuple(range(d + 1, length))) if d + 1 < length else target
        head = upto.sum(-1, keepdim=True)
        out.append(torch.where(head > 0, upto / head.clamp_min(1e-300), 0.0))
    return out


def exactness_pvalues(outputs: torch.Tensor, target: torch.Tensor, conds=None) -> dict[str, float]:
    """``outputs`` (N, L) sampled sequences; ``target`` their (V,) * L exact law. One p-value per
    depth d: token d given each prefix seen at least MIN_PREFIX times (the sum of the prefixes'
    chi-square statistics, each with at most V cells), and one for the joint (cells pooled)."""
    conds = conds or conditionals(target)
    n, length = outputs.shape
    out = {}
    for d in range(length):
        code = outputs[:, :d] @ torch.tensor([V ** (d - 1 - i) for i in range(d)], dtype=torch.long) if d \
            else torch.zeros(n, dtype=torch.long)
        table = torch.bincount(code * V + outputs[:, d], minlength=V ** (d + 1)).view(-1, V)
        flat_cond = conds[d].reshape(-1, V)
        stat, dof = 0.0, 0
        for c in (table.sum(1) >= MIN_PREFIX).nonzero().flatten().tolist():
            s, k = _chi2(table[c], flat_cond[c], 5.0)
            stat, dof = stat + s, dof + k
        out[f"token {d + 1} given its prefix"] = _pvalue(stat, dof)
    flat = outputs @ torch.tensor([V ** (length - 1 - i) for i in range(length)])
    out["joint"] = chi2_pvalue(torch.bincount(flat, minlength=V ** length), target, pool_below=20.0)
    return out


def rejects(pvalues: dict[str, float], alpha: float = ALPHA) -> bool:
    return min(pvalues.values()) < alpha / len(pvalues)


def sample_law(law: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` sequences drawn from a (V,) * L law: (n, L)."""
    length = law.dim()
    flat = torch.multinomial(law.flatten().float(), n, replacement=True, generator=gen)
    digits = [(flat // V ** (length - 1 - i)) % V for i in range(length)]
    return torch.stack(digits, 1)


def run_sampled(kind: str, world: World, sp: SamplingParams, n: int, seed: int) -> torch.Tensor:
    """(n, L) sequences from the verifier with a real seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    return torch.tensor([generate_world(kind, world, sp, gen) for _ in range(n)])


# ---- shifts of total variation ``tv`` of each kind, for measuring the test's power ----------------

def shift_conditional(law: torch.Tensor, depth: int, tv: float, shape: str) -> torch.Tensor:
    """``law`` with every conditional distribution of token ``depth`` (1-based) replaced by one at
    total variation ``tv`` from it (so the joint moves by exactly ``tv``). ``shape``: "cell" (the
    mass moved into the least likely live token), "top" (out of the most likely token, spread
    over the others in proportion), "spread" (towards uniform over the live tokens)."""
    length = law.dim()
    # P(x_1 .. x_depth) (summing over no dimension at all would sum over every one in torch)
    prefix = law.sum(dim=tuple(range(depth, length)), keepdim=True) if depth < length else law
    head = law.sum(dim=tuple(range(depth - 1, length)), keepdim=True)  # P(x_1 .. x_{depth-1})
    cond = torch.where(head > 0, prefix / head.clamp_min(1e-300), 0.0)  # P(x_depth | before)
    rest = torch.where(prefix > 0, law / prefix.clamp_min(1e-300), 0.0)  # law of the tokens after
    new = cond.clone()
    for idx in itertools.product(*[range(V)] * (depth - 1)):
        c = cond[idx].flatten()
        if c.sum() <= 0:
            continue
        live = c > 0
        if int(live.sum()) < 2:
            continue  # a single possible token cannot move
        new[idx] = _shift(c, tv, shape, live).view(new[idx].shape)
    return new * head * rest


def _shift(c: torch.Tensor, tv: float, shape: str, live: torch.Tensor) -> torch.Tensor:
    c = c.clone()
    if shape == "cell":
        j = int(torch.where(live, c, torch.inf).argmin())
        take = min(tv, 1 - float(c[j]))
        c = c * (1 - take / (1 - float(c[j])))
        c[j] += take
    elif shape == "top":
        j = int(c.argmax())
        take = min(tv, float(c[j]))
        others = c.clone()
        others[j] = 0
        c = c + others / others.sum() * take
        c[j] -= take
    elif shape == "spread":
        u = live.double() / live.sum()
        dist = 0.5 * float((u - c).abs().sum())
        c = c + (u - c) * min(1.0, tv / dist) if dist > 0 else c
    else:
        raise ValueError(shape)
    return c


def shift_joint(law: torch.Tensor, tv: float, shape: str) -> torch.Tensor:
    """The joint moved by ``tv``: "cell" (into its least likely possible outcome) or "spread"
    (towards uniform over every possible outcome)."""
    flat = law.flatten().clone()
    return _shift(flat, tv, shape, flat > 0).view(law.shape)


def tv_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a.double() - b.double()).abs().sum())


# ---- mutants: verifiers that are slightly wrong, which the tests must reject ----------------------

def _biased_depth_sampling(tree, probs, generator, depth: int = 3, factor: float = 1.15):
    """verify_sampling, except that a child at ``depth`` is accepted ``factor`` times too often."""
    node, path = 0, [0]
    while True:
        p = probs[node].clone()
        chosen = None
        for child in tree.candidate_children(node):
            x, total = tree.tokens[child], float(p.sum())
            bias = factor if tree.depths[child] == depth else 1.0
            if total > 0 and verify_mod._uniform(generator) < bias * float(p[x]) / total:
                chosen = child
                break
            p[x] = 0.0
        if chosen is None:
            return path, verify_mod.sample(p / p.sum(), generator)
        path.append(chosen)
        node = chosen


def _scaled_residual_draft_model(chain_tokens, p, q, generator, factor: float = 0.9):
    """verify_draft_model, except that the residual is max(p - factor * q, 0)."""
    for i, x in enumerate(chain_tokens):
        px, qx = float(p[i, x]), float(q[i, x])
        if qx > 0 and verify_mod._uniform(generator) < min(1.0, px / qx):
            continue
        residual = (p[i] - factor * q[i]).clamp_min(0)
        return i, verify_mod.sample(residual / residual.sum(), generator)
    return len(chain_tokens), verify_mod.sample(p[len(chain_tokens)], generator)


def _top_p_one_more(logits, sp):
    """probs_from_logits keeping one token past top-p's cut."""
    if sp.greedy or sp.top_p >= 1.0:
        return probs_from_logits(logits, sp)
    wide = probs_from_logits(logits, SamplingParams(temperature=sp.temperature, top_k=sp.top_k))
    s, order = wide.sort(dim=-1, descending=True, stable=True)
    drop = (s.cumsum(-1) - s) >= sp.top_p
    drop = torch.cat([torch.zeros_like(drop[..., :1]), drop[..., :-1]], -1)  # one more kept
    keep = ~torch.zeros_like(drop).scatter(-1, order, drop)
    out = wide * keep
    return out / out.sum(-1, keepdim=True)


# name: (kind, setting, what to replace)
MUTANTS = {
    "depth-3 child accepted 1.15x too often": ("tree", "t1", [(verify_mod, "verify_sampling",
                                                               _biased_depth_sampling)]),
    "draft residual max(p - 0.9 q, 0)": ("draft", "t1", [(verify_mod, "verify_draft_model",
                                                          _scaled_residual_draft_model)]),
    "top-p keeps one token too many": ("tree", "t0.9-topk4-topp0.85", [(verify_mod, "probs_from_logits",
                                                                         _top_p_one_more)]),
}


def apply_mutant(mp, name: str) -> tuple[str, SamplingParams]:
    """Replace what the mutant ``name`` changes (with a pytest MonkeyPatch); its kind and setting."""
    kind, setting, patches = MUTANTS[name]
    for mod, attr, fn in patches:
        mp.setattr(mod, attr, fn)
    return kind, SETTINGS[setting]
