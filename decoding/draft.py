"""Speculative decoding with a small draft model sharing the target's tokenizer
(Leviathan et al. 2023; Chen et al. 2023). The draft model runs k cheap autoregressive steps
for the whole batch on its own paged cache; the target verifies the chain in one forward,
greedily or with the min(1, p/q) rule under sampling. ``draft+pld`` (DraftPLD) merges prompt
lookup's candidates into the same trie and verifies both in that one forward, exactly under
sampling (decoding/verify.py: verify_mixed)."""

from dataclasses import dataclass
from typing import Optional

import torch

from decoding.proposer import Budget, Context, Outcome, Proposer, SeqState
from decoding.sampling import SamplingParams, probs_from_logits, sample
from decoding.prompt_lookup import PromptLookupConfig, lookup_candidates
from decoding.tree import DRAFT, PLD, StepTree
from decoding.verify import verify_draft_model, verify_mixed
from models.llama import Transformer
from models.runner import ModelRunner, StepInput


@dataclass(slots=True)
class DraftModelConfig:
    num_draft: int = 5  # draft tokens per step at most (k)

    def __post_init__(self):
        if self.num_draft < 1:
            raise ValueError(f"num_draft (draft length) must be >= 1, got {self.num_draft}")


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


class DraftModel(Proposer[DraftState]):
    name = "draft"
    State = DraftState
    sources = DRAFT

    def __init__(self, draft: Transformer, cfg: Optional[DraftModelConfig] = None):
        self.draft, self.cfg = draft, cfg or DraftModelConfig()
        self.runner: Optional[ModelRunner] = None  # the draft model's own cache, per generate call
        self.sampling = SamplingParams()

    def init_state(self, base: SeqState) -> DraftState:
        return DraftState(**base.seq_fields())

    def begin(self, states: list[DraftState], ctx: Context) -> None:
        if self.draft.cfg.vocab_size != ctx.vocab_size:
            raise ValueError(f"draft model vocabulary ({self.draft.cfg.vocab_size} tokens) differs from the "
                             f"target's ({ctx.vocab_size}): the two models must share a tokenizer")
        self.sampling = ctx.sampling
        self.runner = ModelRunner.for_batch(self.draft, [s.prompt for s in states], ctx.max_new_tokens,
                                            self.cfg.num_draft + 1)
        for s in states:
            self.runner.add_sequence(s.sid)

    @torch.inference_mode()
    def propose(self, states: list[DraftState], budgets: list[Budget], ctx: Context) -> list[StepTree]:
        want = {s.sid: min(b.max_depth, b.max_nodes, self.cfg.num_draft) for s, b in zip(states, budgets)}
        chains = {s.sid: [] for s in states}
        qs = {s.sid: [] for s in states}
        by_sid = {s.sid: s for s in states}
        # feed what the draft cache lacks (at least the root), then one token per draft step
        feed = {s.sid: s.tokens[s.cached:] for s in states if want[s.sid] > 0}
        while feed:
            sids = list(feed)
            outs = self.runner.step([StepInput(sid, feed[sid], logits_rows=[len(feed[sid]) - 1]) for sid in sids])
            self.runner.commit({sid: list(range(len(feed[sid]))) for sid in sids})
            nxt = {}
            for sid, logits in zip(sids, outs):
                s = by_sid[sid]
                s.cached += len(feed[sid])
                q = probs_from_logits(logits, self.sampling)[0]
                tok = int(q.argmax()) if self.sampling.greedy else sample(q, s.generator)
                chains[sid].append(tok)
                qs[sid].append(q)
                if len(chains[sid]) < want[sid]:
                    nxt[sid] = [tok]
            feed = nxt
        trees = []
        for s in states:
            tree = StepTree.root(s.root)
            tree.add_chain(chains[s.sid], DRAFT)
            s.q = torch.stack(qs[s.sid]) if qs[s.sid] else None
            trees.append(tree)
        return trees

    def verify(self, state, tree, logits, rows, sampling):
        if sampling.greedy or len(tree) == 1:
            return super().verify(state, tree, logits, rows, sampling)
        p = probs_from_logits(logits[[rows[n] for n in range(len(tree))]], sampling)  # (k + 1, V) chain order
        n_ok, token = verify_draft_model(tree.tokens[1:], p, state.q[:len(tree) - 1], state.generator)
        return list(range(n_ok + 1)), token

    def update(self, state: DraftState, outcome: Outcome) -> None:
        keep = draft_cache_keep(state.cached, len(state.tokens), len(outcome.new_tokens), outcome.accepted)
        if keep < state.cached:
            self.runner.truncate(state.sid, keep)
            state.cached = keep

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

    def propose(self, states: list[DraftState], budgets: list[Budget], ctx: Context) -> list[StepTree]:
        trees = super().propose(states, budgets, ctx)
        todo = [i for i, b in enumerate(budgets) if b.max_depth > 0]
        if todo:
            found = lookup_candidates(ctx.backend, [states[i].tokens for i in todo], self.pld, ctx.device)
            for i, chains in zip(todo, found):
                for chain in chains:
                    trees[i].add_chain(chain[:budgets[i].max_depth], PLD, budgets[i].max_nodes)
        return trees

    def verify(self, state, tree, logits, rows, sampling):
        if sampling.greedy or len(tree) == 1:
            return Proposer.verify(self, state, tree, logits, rows, sampling)
        nodes = [n for n in rows if tree.candidate[n]]
        probs = probs_from_logits(logits[[rows[n] for n in nodes]], sampling)
        return verify_mixed(tree, dict(zip(nodes, probs)), state.q, state.generator)

    def update(self, state: DraftState, outcome: Outcome) -> None:
        on_chain = 0  # accepted nodes that are the draft chain's (its cache agrees that far)
        for n in outcome.path[1:]:
            if not outcome.tree.sources[n] & DRAFT:
                break
            on_chain += 1
        keep = draft_cache_keep(state.cached, len(state.tokens), len(outcome.new_tokens), on_chain)
        if keep < state.cached:
            self.runner.truncate(state.sid, keep)
            state.cached = keep
