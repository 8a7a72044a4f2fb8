"""Speculative decoding with a small draft model sharing the target's tokenizer
(Leviathan et al. 2023; Chen et al. 2023). The draft model runs k cheap autoregressive steps
for the whole batch on its own paged cache; the target verifies the chain in one forward,
greedily or with the min(1, p/q) rule under sampling. ``draft+pld`` (DraftPLD) merges prompt
lookup's candidates into the same trie and verifies both in that one forward, exactly under
sampling (decoding/verify.py: verify_mixed)."""

import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from decoding.planner import Acceptance, PlannerConfig, node_keys, node_probs
from decoding.proposer import Budget, Context, Outcome, Proposer, SeqState
from decoding.sampling import SamplingParams, probs_from_logits, sample
from decoding.prompt_lookup import DeviceHistories, HostHistories, PromptLookupConfig, lookup_states
from decoding.tree import DRAFT, PLD, StepTree
from decoding.verify import verify_draft_model, verify_mixed
from models.llama import Transformer
from models.runner import ModelRunner, StepInput


@dataclass(slots=True)
class DraftModelConfig:
    num_draft: int = 5  # draft tokens per step without a planner (k)
    # with a planner: the chain grows while one to three more draft tokens are predicted to
    # raise expected tokens per ms (the draft model's measured time per forward, the target's
    # step-cost curve, each token's chance from the draft's calibrated confidence), up to
    # max_draft tokens
    max_draft: int = 16
    bins: int = 10  # confidence bins of the calibration
    first_prior: float = 0.5  # chance the first draft token is accepted, before any evidence

    def __post_init__(self):
        if self.num_draft < 1:
            raise ValueError(f"num_draft (draft length) must be >= 1, got {self.num_draft}")
        if self.max_draft < 1:
            raise ValueError(f"max_draft (longest planned draft chain) must be >= 1, got {self.max_draft}")
        if self.bins < 1:
            raise ValueError(f"bins must be >= 1, got {self.bins}")
        if not 0.0 < self.first_prior < 1.0:
            raise ValueError(f"first_prior must be in (0, 1), got {self.first_prior}")


class Calibration:
    """The chance that a draft token is accepted given its parent was, as a function of the
    draft model's probability for it ("confidence"): per confidence bin, decayed hits over
    trials smoothed towards the bin's centre (a calibrated draft would sit there). ``first``
    is the chance of the chain's first token before its confidence is known (the mean, plus
    one standard error so that a slow start does not stop drafting for good)."""

    def __init__(self, bins: int = 10, weight: float = 2.0, decay: float = 0.98, first_prior: float = 0.5):
        self.bins, self.weight, self.decay = bins, weight, decay
        self.hits, self.trials = [0.0] * bins, [0.0] * bins
        self.first_prior = first_prior
        self.first_hits = self.first_trials = 0.0

    def bin(self, conf: float) -> int:
        return min(int(conf * self.bins), self.bins - 1)

    def rate(self, conf: float) -> float:
        b = self.bin(conf)
        centre = (b + 0.5) / self.bins
        return (self.hits[b] + centre * self.weight) / (self.trials[b] + self.weight)

    def first(self) -> float:
        n = self.first_trials + self.weight
        p = (self.first_hits + self.first_prior * self.weight) / n
        return min(p + (p * (1 - p) / n) ** 0.5, 0.99)

    def record(self, conf: float, hit: bool, first: bool = False) -> None:
        b, d = self.bin(conf), self.decay
        self.hits[b] = d * self.hits[b] + hit
        self.trials[b] = d * self.trials[b] + 1.0
        if first:
            self.first_hits = d * self.first_hits + hit
            self.first_trials = d * self.first_trials + 1.0


HORIZON = 3  # draft tokens looked ahead when deciding whether to draft on


def worth_drafting(gain: float, ms: float, reach: float, chance: float, more_ms: float) -> bool:
    """Whether more draft tokens raise expected new tokens per ms. The step so far is expected
    to gain ``gain`` tokens in ``ms``; the next token is reached with chance ``reach`` (every
    draft before it accepted); from there the new tokens are expected to add ``chance``
    accepted tokens and cost ``more_ms`` (their draft forwards plus what they add to the
    verification): (gain + reach * chance) / (ms + more_ms) > gain / ms."""
    return reach * chance * ms > gain * more_ms


def draft_cache_keep(cached: int, history_len: int, new_tokens: int, accepted: int) -> int:
    """How many tokens of the draft model's cache still agree with the sequence after a step.

    The draft cache held ``cached`` tokens: the history before the step, then the draft chain
    but its last token. The step accepted ``accepted`` chain tokens and the sequence gained
    ``new_tokens`` (now ``history_len`` tokens). The old history and the accepted chain
    tokens agree; what follows does not, and the newest token is never cached yet."""
    return min(cached, history_len - 1, history_len - new_tokens + accepted)


@dataclass(eq=False, kw_only=True)
class DraftState(SeqState):
    cached: int = 0  # tokens of this sequence in the draft model's cache (a prefix of tokens)
    q: Optional[torch.Tensor] = None  # (k, V) the draft distributions of the chain just proposed
    chain: list[int] = field(default_factory=list)  # the chain's nodes in the tree just proposed
    pld_acc: Optional[Acceptance] = None  # DraftPLD: this sequence's prompt-lookup acceptance
    conf: list[float] = field(default_factory=list)  # the draft's probability of each chain token


class DraftModel(Proposer[DraftState]):
    name = "draft"
    State = DraftState
    sources = DRAFT

    sizes_itself = True

    def __init__(self, draft: Transformer, cfg: Optional[DraftModelConfig] = None):
        self.draft, self.cfg = draft, cfg or DraftModelConfig()
        self.runner: Optional[ModelRunner] = None  # the draft model's own cache, per generate call
        self.sampling = SamplingParams()
        self.calibration = Calibration(self.cfg.bins, first_prior=self.cfg.first_prior)  # kept across calls
        self.token_ms: Optional[float] = None  # measured ms of one draft forward (one token per sequence)
        self.model_ms = 0.0

    def init_state(self, base: SeqState) -> DraftState:
        return DraftState(**base.seq_fields())

    def check(self, model) -> None:
        # the embedding rows: drafts are token ids of the draft's vocabulary and, under sampling,
        # its distributions are compared with the target's row for row. That the tokenizers
        # agree is checked where both are known (TextGenerator, the command lines:
        # decoding/inputs.py, same_tokenizer); a model alone has none
        if self.draft.cfg.vocab_size != model.cfg.vocab_size:
            raise ValueError(f"draft model vocabulary ({self.draft.cfg.vocab_size} tokens) differs from the "
                             f"target's ({model.cfg.vocab_size}): the two models must share a tokenizer")

    def begin(self, states: list[DraftState], ctx: Context) -> None:
        self.sampling = ctx.sampling
        self.runner = ModelRunner.for_batch(self.draft, [s.prompt for s in states], ctx.max_new_tokens,
                                            max(self.cfg.num_draft, self.cfg.max_draft) + 1)
        for s in states:
            self.runner.add_sequence(s.sid)

    @torch.inference_mode()
    def propose(self, states: list[DraftState], budgets: list[Budget], ctx: Context) -> list[StepTree]:
        t_start = time.perf_counter()
        cal = self.calibration
        planned = {s.sid: b.step_ms for s, b in zip(states, budgets) if b.step_ms is not None}
        cap = self.cfg.max_draft if planned else self.cfg.num_draft
        want = {s.sid: min(b.max_depth, b.max_nodes, cap) for s, b in zip(states, budgets)}
        # per planned sequence: expected tokens of the step so far, and the chance of reaching its next token
        gain = {sid: 1.0 for sid in planned}
        reach = {sid: 1.0 for sid in planned}
        chains = {s.sid: [] for s in states}
        qs = {s.sid: [] for s in states}
        confs = {s.sid: [] for s in states}
        by_sid = {s.sid: s for s in states}
        # what the step holds besides the draft chain (DraftPLD: prompt lookup's candidates):
        # expected tokens, the chance they cover the first token, their step tokens
        other = {s.sid: self._other(s) for s in states}
        for sid in planned:
            gain[sid] += other[sid][0]
        # feed what the draft cache lacks (at least the root), then one token per draft step
        feed = {s.sid: s.tokens[s.cached:] for s in states if want[s.sid] > 0 and (
            s.sid not in planned or self._worth(planned[s.sid], 0, gain[s.sid], 1.0,
                                                cal.first() * (1.0 - other[s.sid][1]), len(states), other[s.sid][2]))}
        while feed:
            sids = list(feed)
            t0 = time.perf_counter()
            outs = self.runner.step([StepInput(sid, feed[sid], logits_rows=[len(feed[sid]) - 1]) for sid in sids])
            self.runner.commit({sid: list(range(len(feed[sid]))) for sid in sids})
            nxt = {}
            for sid, logits in zip(sids, outs):
                s = by_sid[sid]
                s.cached += len(feed[sid])
                q = probs_from_logits(logits, self.sampling)[0]
                if self.sampling.greedy:  # q is one-hot: the confidence is the draft's softmax at its argmax
                    tok, conf = int(q.argmax()), float(logits[0].float().softmax(-1).max())
                else:
                    tok = sample(q, s.generator)
                    conf = float(q[tok])
                chains[sid].append(tok)
                qs[sid].append(q)
                confs[sid].append(conf)
                n = len(chains[sid])
                if n >= want[sid]:
                    continue
                if sid in planned:
                    p = cal.rate(conf)
                    reach[sid] *= p
                    gain[sid] += reach[sid]
                    # the next token's chance: this one's (a draft's confidence runs in streaks)
                    if not self._worth(planned[sid], n, gain[sid], reach[sid], p, len(sids), other[sid][2]):
                        continue
                nxt[sid] = [tok]
            if all(len(f) == 1 for f in feed.values()):  # a draft step, not a catch-up: its time per forward
                ms = (time.perf_counter() - t0) * 1e3
                self.token_ms = ms if self.token_ms is None else 0.8 * self.token_ms + 0.2 * ms
            feed = nxt
        trees = []
        for s in states:
            tree = StepTree.root(s.root)
            s.chain = tree.add_chain(chains[s.sid], DRAFT)
            s.conf = confs[s.sid]
            if s.sid in planned:
                tree.chance = {node: cal.rate(c) for node, c in zip(s.chain, s.conf)}
                if not self.sampling.greedy:  # sampled: what was drawn may not decide what is sent
                    tree.pinned = set(s.chain)
            s.q = torch.stack(qs[s.sid]) if qs[s.sid] else None
            trees.append(tree)
        self.model_ms = (time.perf_counter() - t_start) * 1e3
        return trees

    def _worth(self, step_ms, n: int, gain: float, reach: float, chance: float, batch: int, others: int = 0) -> bool:
        """Whether to draft token n + 1 of a sequence that has n (see ``worth_drafting``): a
        draft forward (shared by the ``batch`` sequences drafting with it) plus one more step
        token, beside ``others`` step tokens of other sources. Before the draft's time was
        measured, draft (and measure)."""
        if self.token_ms is None:
            return True
        per = self.token_ms / batch
        now = step_ms(n + 1 + others)
        ms = now + n * per
        # one to three more tokens, each as likely as this one: a cost curve need not be convex
        # (on this CPU a 3-token step of the 1.5B model costs more than a 4-token one)
        expect = 0.0
        for h in range(1, HORIZON + 1):
            expect += chance ** h
            if worth_drafting(gain, ms, reach, expect, h * per + max(0.0, step_ms(n + 1 + h + others) - now)):
                return True
        return False

    def _other(self, state: DraftState) -> tuple[float, float, int]:
        """Expected tokens of the step's other candidates, their chance to cover the first
        token, their step tokens: none for a draft model alone."""
        return 0.0, 0.0, 0

    def verify(self, state, tree, logits, rows, sampling, *, top1=None):
        if sampling.greedy or len(tree) == 1:
            return super().verify(state, tree, logits, rows, sampling, top1=top1)
        p = probs_from_logits(logits[[rows[n] for n in range(len(tree))]], sampling)  # (k + 1, V) chain order
        n_ok, token = verify_draft_model(tree.tokens[1:], p, state.q[:len(tree) - 1], state.generator)
        return list(range(n_ok + 1)), token

    def update(self, state: DraftState, outcome: Outcome) -> None:
        self._calibrate(state, outcome)
        keep = draft_cache_keep(state.cached, len(state.tokens), len(outcome.new_tokens), outcome.accepted)
        if keep < state.cached:
            self.runner.truncate(state.sid, keep)
            state.cached = keep

    def _calibrate(self, state: DraftState, outcome: Outcome) -> None:
        """A trial for each chain token that was sent and whose parent was accepted."""
        on_path = set(outcome.path)
        for i, (node, conf) in enumerate(zip(state.chain, state.conf)):
            if node not in outcome.rows or outcome.tree.parents[node] not in on_path:
                break
            self.calibration.record(conf, node in on_path, first=i == 0)

    def end(self, state: SeqState) -> None:
        if self.runner is not None and self.runner.has_sequence(state.sid):
            self.runner.free(state.sid)


class DraftPLD(DraftModel):
    """The draft model's chain and up to ``pld.num_candidates`` prompt-lookup continuations in
    one trie, verified in one forward. The draft cache keeps only what the accepted path
    shares with the draft chain."""

    name = "draft+pld"
    sources = DRAFT | PLD

    def __init__(self, draft: Transformer, cfg: Optional[DraftModelConfig] = None,
                 pld: Optional[PromptLookupConfig] = None):
        super().__init__(draft, cfg)
        self.pld = pld or PromptLookupConfig(num_candidates=4)
        # how often prompt lookup's candidates are accepted (per depth, rank and streak, as the
        # step planner estimates them): where they are likely, the draft model is not run
        self.pld_rates = Acceptance(PlannerConfig())
        self._found: dict[int, list[list[int]]] = {}
        self.histories = DeviceHistories()
        self.host = HostHistories()  # the histories in C, where the compiled drafting runs

    def init_state(self, base: SeqState) -> DraftState:
        state = super().init_state(base)
        state.pld_acc = Acceptance(PlannerConfig(), self.pld_rates)
        return state

    def propose(self, states: list[DraftState], budgets: list[Budget], ctx: Context) -> list[StepTree]:
        todo = [i for i, b in enumerate(budgets) if b.max_depth > 0]
        self._found = {}
        if todo:  # prompt lookup first: what it will likely give decides how far the draft model runs
            found = lookup_states(ctx.backend, [states[i] for i in todo], self.pld, ctx.device, self.histories,
                                  self.host)
            self._found = {states[i].sid: [c[:budgets[i].max_depth] for c in chains] for i, chains in zip(todo, found)}
        trees = super().propose(states, budgets, ctx)
        for s, b, tree in zip(states, budgets, trees):
            for chain in self._found.get(s.sid, []):
                tree.add_chain(chain, PLD, b.max_nodes)
        return trees

    def _other(self, state: DraftState) -> tuple[float, float, int]:
        chains = self._found.get(state.sid)
        if not chains:
            return 0.0, 0.0, 0
        tree = StepTree.root(state.root)
        for chain in chains:
            tree.add_chain(chain, PLD)
        probs = node_probs(tree, state.pld_acc)
        return sum(probs[1:]), sum(probs[n] for n in tree.candidate_children(0)), len(tree) - 1

    def verify(self, state, tree, logits, rows, sampling, *, top1=None):
        if sampling.greedy or len(tree) == 1:
            return Proposer.verify(self, state, tree, logits, rows, sampling, top1=top1)
        nodes = [n for n in rows if tree.candidate[n]]
        probs = probs_from_logits(logits[[rows[n] for n in nodes]], sampling)
        return verify_mixed(tree, dict(zip(nodes, probs)), state.q, state.generator)

    def update(self, state: DraftState, outcome: Outcome) -> None:
        self._calibrate(state, outcome)
        tree, on_path, acc = outcome.tree, set(outcome.path), state.pld_acc
        for n in outcome.rows:  # prompt lookup's trials: sent nodes whose parent was accepted
            if n and tree.sources[n] & PLD and tree.parents[n] in on_path:
                for key in node_keys(tree, n, acc.streak):
                    if key[0] == PLD:
                        acc.record(key, n in on_path)
        acc.streak = any(tree.sources[n] & PLD for n in outcome.path[1:])
        on_chain = 0  # accepted nodes that are the draft chain's (its cache agrees that far)
        for n in outcome.path[1:]:
            if not outcome.tree.sources[n] & DRAFT:
                break
            on_chain += 1
        keep = draft_cache_keep(state.cached, len(state.tokens), len(outcome.new_tokens), on_chain)
        if keep < state.cached:
            self.runner.truncate(state.sid, keep)
            state.cached = keep
