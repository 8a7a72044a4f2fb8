"""The proposer contract: what a decoding method sees, what it returns, what it learns.

A method is a ``Proposer`` with a typed per-sequence state (a dataclass subclassing
``SeqState``). Per step the generate loop calls, for the active sequences of the batch,

    trees = proposer.propose(states, budgets, ctx)    # one StepTree per sequence
    ... one forward of all trees, verification, KV commit ...
    proposer.update(state, outcome)                   # per sequence: what happened

``propose`` may not read or write the model's cache: it reads its states (the token history
lives in ``state.tokens``) and the read-only ``Context``. ``update`` receives one
``Outcome`` naming nodes of the tree the proposer itself returned. ``verify`` is the one
verification entry (greedy and sampling); a method whose drafts are not one-hot (the draft
model) overrides it with its own rule. With greedy decoding the loop reduces every logits row
once, before ``verify``: its argmax (passed as ``top1`` to a ``verify`` that takes it) and,
for a proposer whose ``top_k`` is above 1, its ``top_k`` best tokens in the same pass
(``Outcome.top_rows``).
"""

from dataclasses import dataclass, field, fields
from typing import Callable, ClassVar, Generic, Optional, TypeVar

import torch

from decoding.sampling import SamplingParams
from decoding.stats import SeqStats
from decoding.tree import StepTree
from decoding.verify import verify
from kernels.rows import argmax_rows, argmax_topk_rows
from models.runner import logits_tensor


@dataclass(eq=False)
class SeqState:
    """What a proposer knows of one sequence. ``tokens`` is the live prompt + output list,
    appended to by the generate loop; proposers only read it."""

    sid: int
    tokens: list[int]
    prompt_len: int
    generator: Optional[torch.Generator] = None

    @property
    def root(self) -> int:
        """The last token: not yet in the cache, the root of the next step's tree."""
        return self.tokens[-1]

    @property
    def prompt(self) -> list[int]:
        return self.tokens[:self.prompt_len]

    @property
    def committed(self) -> int:
        """Tokens whose K/V are in the target's cache (all but the root)."""
        return len(self.tokens) - 1

    def seq_fields(self) -> dict:
        """The SeqState fields alone: ``MyState(**base.seq_fields(), my_field=...)``."""
        return {f.name: getattr(self, f.name) for f in fields(SeqState)}


@dataclass(frozen=True)
class Budget:
    """What one step of one sequence may hold."""

    max_depth: int  # deepest candidate node: a step gains at most max_depth + 1 tokens
    max_nodes: int = 256  # most candidate nodes worth proposing
    # with a planner, for a proposer that sizes its own drafts (``Proposer.sizes_itself``):
    # predicted ms of the whole step (forward + host) if this sequence sends n step tokens
    step_ms: Optional[Callable[[int], float]] = None
    # a step planner picks what to send from the proposed tree: a wide fringe of unlikely nodes
    # is host work for nothing (it takes few of them), so a proposer may propose less
    planned: bool = False


@dataclass(frozen=True)
class Context:
    """What a proposer may use besides its states (read-only; the cache is the runner's)."""

    backend: object  # kernels.backend.Backend: ngram_match on the device
    device: torch.device
    max_context: int  # the model's context: no step position may reach it
    vocab_size: int
    max_new_tokens: int  # of this generate call
    sampling: SamplingParams


@dataclass
class Outcome:
    """What one step did for one sequence, in the node ids of the tree the proposer returned."""

    tree: StepTree
    path: list[int]  # accepted nodes, root (0) first
    new_tokens: list[int]  # what the sequence gained (accepted drafts + bonus, cut at EOS / length)
    # (R, V) fp32 rows the forward computed for this sequence: a tensor, or a models.runner.StepLogits
    # (greedy: multiplied out only if asked; ``logits_tensor`` gives the tensor either way)
    logits: torch.Tensor
    rows: dict[int, int]  # node -> its row in ``logits`` (nodes that were sent and needed logits)
    sent: int  # query tokens the step sent for this sequence
    # per row: the argmax and the top-k (reduced once, cached for later calls)
    _top1: Optional[list[int]] = field(default=None, init=False, repr=False, compare=False)
    _topk: Optional[list[list[int]]] = field(default=None, init=False, repr=False, compare=False)

    @property
    def accepted(self) -> int:
        """Draft tokens accepted (the bonus token is not a draft)."""
        return len(self.path) - 1

    @property
    def rejected(self) -> bool:
        """A draft was turned down: the accepted path ends at a node with candidate children
        that were sent."""
        return any(c in self.rows for c in self.tree.children[self.path[-1]].values())

    def argmax(self, nodes: list[int]) -> list[int]:
        """The model's most likely next token after each of ``nodes`` (one batched argmax)."""
        if not nodes:
            return []
        top1 = self.row_argmax()
        return [top1[self.rows[n]] for n in nodes]

    def row_argmax(self) -> list[int]:
        """Every row's argmax, in the rows' order: reduced once (every row at once, no gathered
        copy of the rows) and kept for later calls."""
        if self._top1 is None:
            self._top1 = argmax_rows(logits_tensor(self.logits))
        return self._top1

    def top_rows(self, k: int) -> list[list[int]]:
        """Per row of ``logits``: the model's k best next tokens, best first (equal logits in
        token order); reduced once (with the argmax) and kept."""
        have = len(self._topk[0]) if self._topk else 0  # the k reduced so far
        if have == k:  # the step's own top-k (the common case: no shape asked, a call of its own)
            return self._topk
        k = min(k, self.logits.shape[-1])
        if have < k:
            self._top1, self._topk = argmax_topk_rows(logits_tensor(self.logits), k)
            have = k
        return self._topk if have == k else [row[:k] for row in self._topk]

    def reduced(self, top1: Optional[list[int]], topk: Optional[list[list[int]]]) -> "Outcome":
        """Prime the caches with what the step already computed (``argmax_topk_rows``)."""
        self._top1, self._topk = top1, topk
        return self


S = TypeVar("S", bound=SeqState)


class Proposer(Generic[S]):
    """Plain autoregressive decoding: the root alone. Subclasses set ``name`` and ``State``."""

    name: ClassVar[str] = "ar"
    State: ClassVar[type] = SeqState
    sources: ClassVar[int] = 0  # the source bits (decoding/tree.py) of the nodes it proposes
    # True: each draft token costs the proposer device time (a draft model's forward), so it picks
    # its own depth from ``Budget.step_ms``, reports that time in ``model_ms`` and may put its own
    # acceptance estimates in ``StepTree.chance``; False: the planner sizes its trees
    sizes_itself: ClassVar[bool] = False
    model_ms: float = 0.0  # ms the last ``propose`` spent running a model (not host overhead)
    # per logits row, the model's best next tokens ``update`` reads (``Outcome.top_rows``): a greedy
    # step reduces the rows to them and their argmax in one pass; <= 1: the argmax alone
    top_k: int = 0

    def init_state(self, base: SeqState) -> S:
        """A fresh state for a sequence right after prefill (``base.tokens`` = prompt + first token)."""
        return self.State(**base.seq_fields())

    def check(self, model) -> None:
        """Raise ValueError when this proposer cannot draft for ``model`` (a draft model with
        another vocabulary); ``generate`` calls it before anything is computed."""

    def begin(self, states: list[S], ctx: Context) -> None:
        """Once per generate call, after ``init_state`` for every sequence (batch resources)."""

    def propose(self, states: list[S], budgets: list[Budget], ctx: Context) -> list[StepTree]:
        return [StepTree.root(s.root) for s in states]

    def verify(self, state: S, tree: StepTree, logits: torch.Tensor, rows: dict[int, int],
               sampling: SamplingParams, *, top1: Optional[list[int]] = None) -> tuple[list[int], int]:
        """(accepted path, bonus token); exact for one-hot drafts, greedy or sampled. ``top1``:
        every row's argmax, when the loop reduced the rows already (greedy)."""
        return verify(tree, logits, rows, sampling, state.generator, top1)

    def update(self, state: S, outcome: Outcome) -> None:
        """Learn from a step (after its tokens were appended to ``state.tokens``)."""

    def end(self, state: S) -> None:
        """The sequence finished (or generation stopped): free its resources."""


@dataclass(eq=False)
class Sequence:
    """The generate loop's view of a sequence: the proposer's state plus bookkeeping."""

    state: SeqState
    max_new_tokens: int
    finish: Optional[str] = None  # "eos" | "length" | "stop" (the caller's on_tokens said so)
    stats: SeqStats = field(default_factory=SeqStats)

    @property
    def output(self) -> list[int]:
        return self.state.tokens[self.state.prompt_len:]

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - (len(self.state.tokens) - self.state.prompt_len)

    def append(self, tokens: list[int], eos: set[int]) -> list[int]:
        """Append until EOS (kept) or max_new_tokens; returns what was appended."""
        seq = self.state.tokens
        added, room = [], self.max_new_tokens - (len(seq) - self.state.prompt_len)  # self.remaining, inline
        for t in tokens[:max(room, 0)]:
            seq.append(t)
            added.append(t)
            if t in eos:
                self.finish = "eos"
                break
        if self.finish is None and room - len(added) <= 0:
            self.finish = "length"
        return added

