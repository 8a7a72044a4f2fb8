"""Temperature, top-k and top-p (``probs_from_logits``) against references that do not call it.

Two independent references:

* ``reference_probs`` below: plain Python in float64, written from the rule as stated, not from
  the code: greedy is the first argmax; logits are divided by the temperature; top-k keeps every
  logit >= the k-th largest (ties at the k-th value are all kept); top-p walks the tokens by
  falling probability (equal probabilities: lower token id first) and drops a token once the
  mass before it reaches top_p (so the top token always stays); what is left is renormalised.
  Checked on hand tables whose answers are worked out in the comments, ties and top-p
  boundaries included, then used on many random rows.
* transformers' own logits processors (temperature, top-k, top-p, in the order its ``generate``
  applies them) on random rows without ties.

Each check is a function of the implementation it checks, so that mutants (a top-p off by one
token, top-k dropping tied values, the temperature applied after the cut, top-p measured before
top-k) can be run through the same checks, which must reject every one of them.
"""

import math

import pytest
import torch

from decoding.sampling import SamplingParams, probs_from_logits

INF = float("inf")


def reference_probs(logits: list[float], temperature: float, top_k: int = 0, top_p: float = 1.0) -> list[float]:
    """The target distribution of one row, in float64, by the rule in the module docstring."""
    V = len(logits)
    if temperature == 0:
        best = max(range(V), key=lambda i: (logits[i], -i))  # the first of equal maxima
        return [1.0 if i == best else 0.0 for i in range(V)]
    z = [x / temperature for x in logits]
    if 0 < top_k < V:
        kth = sorted(z, reverse=True)[top_k - 1]
        z = [x if x >= kth else -INF for x in z]
    m = max(z)
    w = [math.exp(x - m) if x > -INF else 0.0 for x in z]
    total = sum(w)
    p = [x / total for x in w]
    if top_p < 1.0:
        kept, before = set(), 0.0
        for i in sorted(range(V), key=lambda i: (-p[i], i)):
            if before >= top_p:
                break
            kept.add(i)
            before += p[i]
        total = sum(p[i] for i in kept)
        p = [p[i] / total if i in kept else 0.0 for i in range(V)]
    return p


def log(ps):
    return [math.log(x) if x > 0 else -INF for x in ps]


# (logits, temperature, top_k, top_p, expected probabilities, worked out by hand)
HAND = [
    # greedy: the first of two equal maxima
    ([1.0, 3.0, 3.0, 0.0], 0.0, 0, 1.0, [0, 1, 0, 0]),
    # temperature 0.5 doubles the logits: weights 1 : 4
    ([0.0, math.log(2)], 0.5, 0, 1.0, [0.2, 0.8]),
    # temperature 2 halves them: weights 1 : 2
    ([0.0, math.log(4)], 2.0, 0, 1.0, [1 / 3, 2 / 3]),
    # a masked (-inf) logit stays at zero
    ([0.0, -INF, 0.0], 1.0, 0, 1.0, [0.5, 0, 0.5]),
    # top-k 2 with a tie at the 2nd value: all three tokens >= it stay (weights e^1 : 1 : 1)
    ([3.0, 2.0, 2.0, 1.0], 1.0, 2, 1.0, [math.e / (math.e + 2), 1 / (math.e + 2), 1 / (math.e + 2), 0]),
    # top-k 1 with tied maxima keeps both
    ([1.0, 1.0, 0.0], 1.0, 1, 1.0, [0.5, 0.5, 0]),
    # top-k >= V: off
    ([0.0, math.log(3)], 1.0, 5, 1.0, [0.25, 0.75]),
    # top-p on .5 .3 .15 .05: 0.49 keeps one token (mass before the 2nd is .5)
    (log([0.5, 0.3, 0.15, 0.05]), 1.0, 0, 0.49, [1, 0, 0, 0]),
    # 0.51 keeps two (.5 before the 2nd is below it; .8 before the 3rd is not)
    (log([0.5, 0.3, 0.15, 0.05]), 1.0, 0, 0.51, [0.625, 0.375, 0, 0]),
    # 0.79 still keeps two; 0.81 keeps three (the token that crosses top_p stays)
    (log([0.5, 0.3, 0.15, 0.05]), 1.0, 0, 0.79, [0.625, 0.375, 0, 0]),
    (log([0.5, 0.3, 0.15, 0.05]), 1.0, 0, 0.81, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0]),
    # the same distribution shuffled over the ids: the cut follows probability, not id
    (log([0.15, 0.05, 0.5, 0.3]), 1.0, 0, 0.6, [0, 0, 0.625, 0.375]),
    # a tie across the boundary (.4 .2 .2 .2, top_p .7): masses before are 0, .4, .6, .8, so
    # the lower two of the tied ids stay and the highest goes
    (log([0.4, 0.2, 0.2, 0.2]), 1.0, 0, 0.7, [0.5, 0.25, 0.25, 0]),
    (log([0.2, 0.2, 0.4, 0.2]), 1.0, 0, 0.7, [0.25, 0.25, 0.5, 0]),
    # the smallest top-p keeps only the top token
    (log([0.3, 0.7]), 1.0, 0, 1e-9, [0, 1]),
    # temperature comes before top-p: at T = .5 the weights .25 .09 .04 give the top token
    # .658 > .6, so it is kept alone (at T = 1 it is .5 and two stay)
    (log([0.5, 0.3, 0.2]), 0.5, 0, 0.6, [1, 0, 0]),
    (log([0.5, 0.3, 0.2]), 1.0, 0, 0.6, [0.625, 0.375, 0]),
    # top-p measures the mass left by top-k: top-2 of .4 .3 .2 .1 renormalised is 4/7, 3/7, so
    # top_p .5 keeps one token (on the mass before top-k, .4 < .5, it would keep two)
    (log([0.4, 0.3, 0.2, 0.1]), 1.0, 2, 0.5, [1, 0, 0, 0]),
    (log([0.4, 0.3, 0.2, 0.1]), 1.0, 2, 0.6, [4 / 7, 3 / 7, 0, 0]),
]


def check_hand_tables(fn) -> list[str]:
    """Mismatches of ``fn(logits (R, V), SamplingParams)`` on the hand tables (empty: all right)."""
    bad = []
    for logits, t, k, p, want in HAND:
        got = fn(torch.tensor([logits]), SamplingParams(temperature=t, top_k=k, top_p=p))[0].double()
        if not torch.allclose(got, torch.tensor(want, dtype=torch.float64), atol=1e-6, rtol=0):
            bad.append(f"logits={logits} T={t} top_k={k} top_p={p}: {got.tolist()} != {want}")
    return bad


def test_reference_matches_the_hand_tables():
    """The reference itself against the worked answers (so that it is trusted below)."""
    for logits, t, k, p, want in HAND:
        assert reference_probs(logits, t, k, p) == pytest.approx(want, abs=1e-12), (logits, t, k, p)


def test_hand_tables():
    assert check_hand_tables(probs_from_logits) == []


def random_rows(seed: int, rows: int, V: int, ties: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if ties:  # few distinct values: many exact ties, also around the top-k and top-p cuts
        return torch.randint(-3, 3, (rows, V), generator=g).float() * 0.75
    return torch.randn(rows, V, generator=g) * 2.5


def _boundary_is_clear(row: list[float], sp: SamplingParams, margin: float = 1e-5) -> bool:
    """False when top-p's cut falls within float32 rounding of a mass before some token: there
    fp32 and float64 may disagree by one token, which no implementation can be blamed for."""
    if sp.top_p >= 1.0 or sp.greedy:
        return True
    p = reference_probs(row, sp.temperature, sp.top_k, 1.0)
    before = 0.0
    for i in sorted(range(len(p)), key=lambda i: (-p[i], i)):
        if abs(before - sp.top_p) < margin:
            return False
        before += p[i]
    return True


GRID = [SamplingParams(temperature=t, top_k=k, top_p=p)
        for t in (0.0, 0.3, 1.0, 1.7) for k in (0, 1, 3, 40) for p in (1.0, 0.05, 0.5, 0.9)]


def check_random_rows(fn, V: int, ties: bool, rows: int = 12) -> tuple[list[str], int]:
    """Mismatches of ``fn`` against ``reference_probs`` over the parameter grid on random rows,
    and how many rows were compared (rows at an unclear top-p cut are skipped)."""
    bad, compared = [], 0
    for j, sp in enumerate(GRID):
        logits = random_rows(j + 100 * V + ties, rows, V, ties)
        got = fn(logits, sp).double()
        for r in range(rows):
            row = logits[r].tolist()
            if not _boundary_is_clear(row, sp):
                continue
            compared += 1
            want = torch.tensor(reference_probs(row, sp.temperature, sp.top_k, sp.top_p), dtype=torch.float64)
            if not torch.allclose(got[r], want, atol=1e-6, rtol=0):
                bad.append(f"V={V} {sp} row {r}: max diff {float((got[r] - want).abs().max()):.3g}")
    return bad, compared


@pytest.mark.parametrize("V, ties, rows", [(5, False, 12), (5, True, 12), (97, False, 12), (97, True, 12),
                                           (300, True, 3), (1000, False, 2)])
def test_random_rows_match_the_reference(V, ties, rows):
    bad, compared = check_random_rows(probs_from_logits, V, ties, rows)
    assert bad == []
    assert compared >= 0.9 * rows * len(GRID)  # the skipped rows are the rare near-ties with top_p


def hf_probs(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """transformers' processors, in the order its generate applies them; then softmax."""
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)

    scores = logits.double()
    if sp.greedy:
        return torch.nn.functional.one_hot(scores.argmax(-1), scores.shape[-1]).double()
    scores = TemperatureLogitsWarper(sp.temperature)(None, scores)
    if sp.top_k:
        scores = TopKLogitsWarper(sp.top_k)(None, scores)
    if sp.top_p < 1.0:
        scores = TopPLogitsWarper(sp.top_p)(None, scores)
    return scores.softmax(-1)


@pytest.mark.parametrize("V", [7, 97, 1000])
def test_matches_transformers_logits_processors(V):
    """Rows without ties (normal logits), where transformers' rule and ours must agree."""
    for j, sp in enumerate(GRID):
        logits = random_rows(j + 7 * V, 12 if V < 1000 else 3, V, ties=False)
        want = hf_probs(logits, sp)
        got = probs_from_logits(logits, sp).double()
        for r in range(len(logits)):
            if _boundary_is_clear(logits[r].tolist(), sp):
                torch.testing.assert_close(got[r], want[r], atol=1e-6, rtol=0, msg=f"{sp} row {r}")


def test_top_p_ties_keep_the_lower_ids_in_a_large_vocabulary():
    """One big token and 255 tied ones (weights e^5 and 1): top_p .5 keeps the big one and the
    tied ones whose mass before stays below .5, i.e. the 54 lowest ids. A sort that is not stable
    (torch's CPU sort is not, from about 100 entries on) keeps an arbitrary 54 of them, so the
    target distribution would depend on how a row happens to be sorted (a batch of rows or one)."""
    V, big = 256, 200
    logits = torch.zeros(1, V)
    logits[0, big] = 5.0
    got = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.5))[0]
    z = math.exp(5) + V - 1
    n_tied = math.ceil((0.5 - math.exp(5) / z) * z)  # tied tokens whose mass before is < .5
    assert n_tied == 54
    kept = [i for i in range(V) if got[i] > 0]
    assert kept == sorted(list(range(n_tied)) + [big])
    torch.testing.assert_close(got.double(), torch.tensor(reference_probs(logits[0].tolist(), 1.0, 0, 0.5),
                                                          dtype=torch.float64), atol=1e-6, rtol=0)


# ---- mutants: each must be caught -------------------------------------------------------------

def _top_p_inclusive(logits, sp):
    """Drops the token that crosses top_p (cumulative mass including it): one token too few."""
    return _variant(logits, sp, inclusive=True)


def _top_p_one_more(logits, sp):
    """Keeps one token past the cut."""
    return _variant(logits, sp, extra=1)


def _top_k_strict(logits, sp):
    """Keeps exactly k tokens, dropping values tied with the k-th."""
    return _variant(logits, sp, strict_k=True)


def _temperature_last(logits, sp):
    """Cuts on the raw logits, then applies the temperature."""
    return _variant(logits, sp, temperature_last=True)


def _top_p_before_top_k(logits, sp):
    """Measures top-p's mass on the distribution before top-k."""
    return _variant(logits, sp, p_before_k=True)


def _variant(logits, sp, inclusive=False, extra=0, strict_k=False, temperature_last=False, p_before_k=False):
    logits = logits.double()
    if sp.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).double()
    t = 1.0 if temperature_last else sp.temperature
    z = logits / t
    keep_k = torch.ones_like(z, dtype=torch.bool)
    if sp.top_k and sp.top_k < z.shape[-1]:
        vals, idx = z.topk(sp.top_k, dim=-1)
        if strict_k:
            keep_k = torch.zeros_like(keep_k).scatter(-1, idx, True)
        else:
            keep_k = z >= vals[..., -1:]
    zk = z.masked_fill(~keep_k, -INF)
    keep_p = torch.ones_like(keep_k)
    if sp.top_p < 1.0:
        base = z if p_before_k else zk
        s, order = base.sort(dim=-1, descending=True, stable=True)
        ps = s.softmax(-1)
        before = ps.cumsum(-1) - (0 if inclusive else ps)
        drop = before >= sp.top_p
        if extra:
            drop = torch.cat([torch.zeros_like(drop[..., :extra]), drop[..., :-extra]], -1)
        drop[..., 0] = False
        keep_p = ~torch.zeros_like(drop).scatter(-1, order, drop)
    out = (logits / sp.temperature if temperature_last else z).masked_fill(~(keep_k & keep_p), -INF)
    return out.softmax(-1)


MUTANTS = [_top_p_inclusive, _top_p_one_more, _top_k_strict, _temperature_last, _top_p_before_top_k]


def test_the_unmutated_variant_passes():
    """The mutants' common body, unmutated, passes every check: each mutant fails for its change."""
    assert check_hand_tables(_variant) == []
    assert check_random_rows(_variant, 97, False)[0] == [] and check_random_rows(_variant, 97, True)[0] == []


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.__name__)
def test_mutants_fail_the_checks(mutant):
    assert check_hand_tables(mutant)  # each is caught by a hand table
    assert check_random_rows(mutant, 97, False)[0] or check_random_rows(mutant, 97, True)[0]
