"""Speculative decoding with a small draft model sharing the target's tokenizer
(Leviathan et al. 2023; Chen et al. 2023). The draft model runs k cheap autoregressive steps
for the whole batch on its own paged cache; the target verifies the chain in one forward,
greedily or with the min(1, p/q) rule under sampling."""

from dataclasses import dataclass, field
from typing import Optional

import torch

from decoding.budget import AdaptiveDepth, BudgetConfig
from decoding.generate import Proposer, Sequence, make_runner
from decoding.sampling import probs_from_logits, sample
from decoding.tree import DRAFT, StepTree
from decoding.verify import verify_draft_model
from models.llama import Transformer
from models.runner import StepInput


@dataclass(slots=True)
class DraftModelConfig:
    num_draft: int = 5  # draft tokens per step (k)
    budget: BudgetConfig = field(default_factory=lambda: BudgetConfig(enabled=False))

    def __post_init__(self):
        if self.num_draft < 1:
            raise ValueError(f"num_draft (draft length) must be >= 1, got {self.num_draft}")


class DraftModel(Proposer):
    name = "draft"

    def __init__(self, draft: Transformer, cfg: Optional[DraftModelConfig] = None):
        self.draft, self.cfg = draft, cfg or DraftModelConfig()

    def start(self, seqs, runner, sampling):
        target = runner.model.cfg
        if self.draft.cfg.vocab_size != target.vocab_size:
            raise ValueError(f"draft model vocabulary ({self.draft.cfg.vocab_size} tokens) differs from the "
                             f"target's ({target.vocab_size}): the two models must share a tokenizer")
        self.sampling = sampling
        max_new = max(s.max_new_tokens for s in seqs)
        self.drunner = make_runner(self.draft, [s.prompt for s in seqs], max_new, self.cfg.num_draft + 1)
        for s in seqs:
            self.drunner.add_sequence(s.sid)
            s.state.update(done=0, budget=AdaptiveDepth(self.cfg.budget), q=None)

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], max_depth: list[int]) -> list[StepTree]:
        k = [s.state["budget"].depth(min(d, self.cfg.num_draft)) for s, d in zip(seqs, max_depth)]
        chains = {s.sid: [] for s in seqs}
        qs = {s.sid: [] for s in seqs}
        # feed what the draft cache lacks (at least the root), then one token per draft step
        feed = {s.sid: s.history[s.state["done"]:] for s, kk in zip(seqs, k) if kk > 0}
        want = {s.sid: kk for s, kk in zip(seqs, k)}
        by_sid = {s.sid: s for s in seqs}
        while feed:
            sids = list(feed)
            outs = self.drunner.step([StepInput(sid, feed[sid], logits_rows=[len(feed[sid]) - 1]) for sid in sids])
            self.drunner.commit({sid: list(range(len(feed[sid]))) for sid in sids})
            nxt = {}
            for sid, logits in zip(sids, outs):
                s = by_sid[sid]
                s.state["done"] += len(feed[sid])
                q = probs_from_logits(logits, self.sampling)[0]
                tok = int(q.argmax()) if self.sampling.greedy else sample(q, s.generator)
                chains[sid].append(tok)
                qs[sid].append(q)
                if len(chains[sid]) < want[sid]:
                    nxt[sid] = [tok]
            feed = nxt
        trees = []
        for s in seqs:
            tree = StepTree.root(s.root)
            tree.add_chain(chains[s.sid], DRAFT)
            s.state["q"] = torch.stack(qs[s.sid]) if qs[s.sid] else None
            trees.append(tree)
        return trees

    def verify_sampling(self, seq, tree, probs):
        chain = tree.tokens[1:]
        p = torch.stack([probs[n] for n in range(len(tree))])  # (k + 1, V): the chain's nodes in order
        if not chain:
            return [0], sample(p[0], seq.generator)
        n_ok, token = verify_draft_model(chain, p, seq.state["q"], seq.generator)
        return list(range(n_ok + 1)), token

    def observe(self, seq, tree, rows, logits, path, new_tokens):
        seq.state["budget"].update(len(path) - 1, len(path) < len(tree))
        # the draft cache holds the old history plus the chain minus its last token; keep
        # only what still agrees with the sequence
        keep = min(seq.state["done"], len(seq.history) - 1)
        agree = len(seq.prompt) + len(seq.output) - len(new_tokens) + len(path) - 1
        keep = min(keep, agree)
        if keep < seq.state["done"]:
            self.drunner.cache.truncate(seq.sid, keep)
            seq.state["done"] = keep

    def finish(self, seq):
        self.drunner.free(seq.sid)
