"""Sampling exactness: every speculative method samples exactly the target distribution.

A tiny model with a 6-token vocabulary; the exact joint distribution of the first three
sampled tokens (216 outcomes) is computed by enumeration, and each method's empirical joint
over many seeded sequences is tested against it with a chi-square test. Seeds are fixed, so
the test is deterministic; its power is shown on a distribution shifted by 5% total
variation and on a deliberately wrong verifier, both of which it must reject.
"""

import itertools

import pytest
import torch

from decoding.draft import DraftModel, DraftModelConfig, DraftPLD
from decoding.generate import generate
from decoding.jacobi import JacobiConfig
from decoding.hybrid import HybridConfig
from decoding.lookahead import LookaheadConfig, LookaheadPLD
from decoding.methods import make_proposer
from decoding.planner import Planner, PlannerConfig
from decoding.prompt_lookup import PromptLookupConfig
from decoding.sampling import SamplingParams, probs_from_logits
from helpers import ours_from_hf, tiny_hf_model
from test_sampling_reference import reference_probs
from models.runner import StepInput

V = 6
N_SAMPLES = 2000
ALPHA = 1e-3  # significance of the chi-square test
PROMPT = [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 1, 2, 0, 1]
SMALL_LA = dict(window=3, ngram=3, guesses=3)


def peaky_model(seed):
    hf = tiny_hf_model("llama", seed=seed, vocab_size=V)
    with torch.no_grad():
        hf.model.norm.weight.mul_(4.0)  # sharpen: drafts then get accepted often
    return ours_from_hf(hf).model


@pytest.fixture(scope="module")
def target():
    return peaky_model(11)


def exact_joint(model, sp: SamplingParams) -> torch.Tensor:
    """(V, V, V) probabilities of the first three tokens, by enumeration."""
    from models.runner import ModelRunner

    def dist(prefix):
        runner = ModelRunner.for_batch(model, [prefix], 1)
        runner.add_sequence(0)
        logits = runner.step([StepInput(0, prefix, logits_rows=[len(prefix) - 1])])[0]
        # the target from the independent float64 reference, not from the code under test
        return torch.tensor(reference_probs(logits[0].double().tolist(), sp.temperature, sp.top_k, sp.top_p),
                            dtype=torch.float64)

    joint = torch.zeros(V, V, V, dtype=torch.float64)
    p1 = dist(PROMPT)
    for a in range(V):
        if p1[a] == 0:
            continue
        p2 = dist(PROMPT + [a])
        for b in range(V):
            if p2[b] > 0:
                joint[a, b] = p1[a] * p2[b] * dist(PROMPT + [a, b])
    return joint


def empirical(model, proposer, sp: SamplingParams, planner=None) -> tuple[torch.Tensor, int]:
    res = generate(model, [PROMPT] * N_SAMPLES, proposer, max_new_tokens=3, sampling=sp, eos_token_ids=(),
                   planner=planner)
    counts = torch.zeros(V, V, V, dtype=torch.float64)
    for r in res:
        counts[tuple(r.output_ids)] += 1
    return counts, sum(sum(r.stats.accepted.values()) for r in res)


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit; cells expecting < 5 are pooled into one."""
    n = counts.sum()
    exp, obs = (probs * n).flatten(), counts.flatten()
    big = exp >= 5
    e = torch.cat([exp[big], exp[~big].sum()[None]])
    o = torch.cat([obs[big], obs[~big].sum()[None]])
    keep = e > 0
    assert torch.all(o[~keep] == 0), "a sample fell where the target puts no mass"
    stat = ((o[keep] - e[keep]) ** 2 / e[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


SETTINGS = {
    "t1": SamplingParams(temperature=1.0, seed=1),
    "t0.7-topk4-topp0.9": SamplingParams(temperature=0.7, top_k=4, top_p=0.9, seed=2),
}


def method(name, target):
    if name == "draft":
        return DraftModel(peaky_model(12), DraftModelConfig(num_draft=3))
    if name == "draft+pld":  # mixed proposals in one trie: the draft chain (q) and one-hot PLD chains
        return DraftPLD(peaky_model(12), DraftModelConfig(num_draft=3), PromptLookupConfig(num_candidates=2))
    if name.startswith("lookahead"):
        return make_proposer(name, config=LookaheadConfig(**SMALL_LA))
    if name == "hybrid":
        return make_proposer(name, config=HybridConfig(lookahead=LookaheadConfig(**SMALL_LA)))
    if name == "pld":
        return make_proposer(name, config=PromptLookupConfig(num_candidates=2))  # a tree of two chains
    if name == "jacobi":
        return make_proposer(name, config=JacobiConfig(window=3))
    return make_proposer(name)


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("name", ["ar", "pld", "jacobi", "lookahead", "lookahead+pld", "recycle", "suffix", "hybrid",
                                  "draft", "draft+pld", "planned", "planned-draft"])
def test_joint_of_first_three_tokens_matches_target(target, name, setting):
    sp = SETTINGS[setting]
    exact = exact_joint(target, sp)
    # "planned": lookahead+pld with the step planner pruning its trees (a made-up cost curve
    # under which some drafts pay and some do not)
    # "planned-draft": draft+pld sizing its own chain by the draft's calibrated confidence and
    # its measured forward time, the planner sending the nodes whose chances pay
    planner = Planner(lambda tokens, contexts=None: 100 + 0.02 * sum(tokens), PlannerConfig(learn_overhead=False)) \
        if name.startswith("planned") else None
    inner = {"planned": "lookahead+pld", "planned-draft": "draft+pld"}.get(name, name)
    counts, accepted = empirical(target, method(inner, target), sp, planner)
    assert chi2_pvalue(counts, exact) > ALPHA
    if name != "ar":
        assert accepted > N_SAMPLES // 40  # drafts really were accepted: the verifier was exercised


def test_power_against_a_5_percent_shift(target):
    exact = exact_joint(target, SETTINGS["t1"]).flatten()
    exact = exact / exact.sum()
    j = int(exact.argmax())
    eps = 0.05 / (1 - float(exact[j]))
    shifted = (1 - eps) * exact  # move mass onto one outcome: total variation exactly 0.05
    shifted[j] += eps
    assert abs(0.5 * float((shifted - exact).abs().sum()) - 0.05) < 1e-6
    g = torch.Generator().manual_seed(0)
    draws = torch.multinomial(shifted.float(), N_SAMPLES, replacement=True, generator=g)
    counts = torch.bincount(draws, minlength=V ** 3).double()
    assert chi2_pvalue(counts.view(V, V, V), exact.view(V, V, V)) < ALPHA


class GreedyAcceptLookahead(LookaheadPLD):
    """A wrong verifier: accepts the first candidate child whenever it is the argmax."""

    def verify(self, state, tree, logits, rows, sampling, *, top1=None):
        node, path = 0, [0]
        while True:
            kids = tree.candidate_children(node)
            p = probs_from_logits(logits[rows[node]][None], sampling)[0]
            best = [c for c in kids if tree.tokens[c] == int(p.argmax())]
            if not best:
                return path, int(torch.multinomial(p, 1, generator=state.generator))
            path.append(best[0])
            node = best[0]


def test_detects_a_wrong_verifier(target):
    sp = SETTINGS["t1"]
    counts, _ = empirical(target, GreedyAcceptLookahead(LookaheadConfig(**SMALL_LA)), sp)
    assert chi2_pvalue(counts, exact_joint(target, sp)) < ALPHA


def test_seeded_sampling_is_reproducible_and_batch_invariant(target):
    sp = SamplingParams(temperature=1.0, seed=5)
    prompts = [PROMPT, PROMPT[:5], PROMPT[3:]]
    a = [r.output_ids for r in generate(target, prompts, max_new_tokens=8, sampling=sp, eos_token_ids=())]
    b = [r.output_ids for r in generate(target, prompts, max_new_tokens=8, sampling=sp, eos_token_ids=())]
    assert a == b
    alone = generate(target, prompts[:1], max_new_tokens=8, sampling=sp, eos_token_ids=())[0].output_ids
    assert alone == a[0]
    assert len(set(itertools.chain(*a))) > 1


def test_generators_live_on_the_model_device():
    from decoding.generate import _generator

    gen = _generator(SamplingParams(temperature=1.0, seed=3), 0, torch.device("cpu"))
    assert gen.device.type == "cpu"
    assert _generator(SamplingParams(temperature=1.0), 0, torch.device("cpu")) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_seeded_sampling_on_cuda():
    hf = tiny_hf_model("llama", seed=11, vocab_size=V)
    from models.config import ModelConfig
    from models.loader import build_model
    from kernels.backend import get_backend

    model = build_model(ModelConfig.from_hf(hf.config.to_dict()), hf.state_dict(), get_backend("triton", "cuda"),
                        device="cuda")
    sp = SamplingParams(temperature=1.0, seed=5)
    a = generate(model, [PROMPT] * 3, make_proposer("lookahead+pld"), max_new_tokens=6, sampling=sp, eos_token_ids=())
    b = generate(model, [PROMPT] * 3, make_proposer("lookahead+pld"), max_new_tokens=6, sampling=sp, eos_token_ids=())
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
