"""One generate loop for every method, over a batch of ragged sequences.

Per step every active sequence gets a ``StepTree`` from the method's proposer (root = its
last token, candidate nodes, maybe private lookahead-window nodes); all trees go through
the model in ONE forward; each sequence then accepts its own number of tokens, commits
their K/V, and stops on EOS (inside an accepted draft too) or at exactly max_new_tokens.
"""

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import torch

from decoding.sampling import SamplingParams, probs_from_logits, sample
from decoding.tree import SOURCE_NAMES, StepTree
from decoding.verify import verify_greedy, verify_sampling
from models.llama import Transformer
from models.runner import ModelRunner, StepInput


@dataclass
class SeqStats:
    forwards: int = 0  # model calls after prefill this sequence took part in
    step_tokens: int = 0  # query tokens it put into those forwards
    accepted_hist: Counter = field(default_factory=Counter)  # tokens gained per step -> count
    proposed: Counter = field(default_factory=Counter)  # draft tokens per source branch
    accepted: Counter = field(default_factory=Counter)  # accepted draft tokens per source branch

    def as_dict(self) -> dict:
        return {"forwards": self.forwards, "step_tokens": self.step_tokens,
                "accepted_hist": dict(sorted(self.accepted_hist.items())),
                "proposed": dict(self.proposed), "accepted": dict(self.accepted)}


@dataclass
class Sequence:
    sid: int
    prompt: list[int]
    max_new_tokens: int
    generator: Optional[torch.Generator]
    output: list[int] = field(default_factory=list)
    finish: Optional[str] = None  # "eos" | "length"
    stats: SeqStats = field(default_factory=SeqStats)
    state: dict = field(default_factory=dict)  # the proposer's per-sequence state

    @property
    def history(self) -> list[int]:
        return self.prompt + self.output

    @property
    def root(self) -> int:
        return self.output[-1]

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.output)


class Proposer:
    """Fills the step of each sequence. The base class is plain autoregressive decoding."""

    name = "ar"

    def start(self, seqs: list[Sequence], runner: ModelRunner, sampling: SamplingParams) -> None:
        """Called once after prefill, with every sequence of the batch."""

    def propose(self, seqs: list[Sequence], max_depth: list[int]) -> list[StepTree]:
        """One tree per active sequence; candidates may not go deeper than max_depth[i]."""
        return [StepTree.root(s.root) for s in seqs]

    def verify_sampling(self, seq: Sequence, tree: StepTree, probs: dict[int, torch.Tensor]) -> tuple[list[int], int]:
        """Sampling verification; one-hot drafts by default (recursive rejection)."""
        return verify_sampling(tree, probs, seq.generator)

    def observe(self, seq: Sequence, tree: StepTree, rows: list[int], logits: torch.Tensor,
                path: list[int], new_tokens: list[int]) -> None:
        """After verification: ``logits[j]`` belongs to node ``rows[j]``; ``path`` the accepted
        nodes (root first); ``new_tokens`` what the sequence gained this step."""

    def finish(self, seq: Sequence) -> None:
        """The sequence is done (free per-sequence resources)."""


@dataclass
class GenerationResult:
    output_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    stats: SeqStats


def check_prompts(prompts: list[list[int]], max_new_tokens: int, context: int, vocab: int) -> None:
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty: a prompt needs at least one token")
        if len(p) + max_new_tokens > context:
            raise ValueError(f"prompt {i} has {len(p)} tokens; with max_new_tokens={max_new_tokens} it needs "
                             f"{len(p) + max_new_tokens} positions, the model context is {context}")
        bad = [t for t in p if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"prompt {i}: token ids must be in [0, {vocab}), got {bad[:3]}")


def _append(seq: Sequence, tokens: list[int], eos: set[int]) -> list[int]:
    """Append until EOS (kept) or max_new_tokens; returns what was appended."""
    added = []
    for t in tokens:
        if seq.remaining <= 0:
            break
        seq.output.append(t)
        added.append(t)
        if t in eos:
            seq.finish = "eos"
            break
    if seq.finish is None and seq.remaining <= 0:
        seq.finish = "length"
    return added


def _prefill(runner: ModelRunner, seqs: list[Sequence], chunk: int) -> dict[int, torch.Tensor]:
    """Causal steps over the prompts, ``chunk`` tokens per sequence per forward; returns the
    last prompt row's logits of each sequence."""
    last, offset = {}, {s.sid: 0 for s in seqs}
    pending = list(seqs)
    while pending:
        inputs, ends = [], []
        for s in pending:
            piece = s.prompt[offset[s.sid]:offset[s.sid] + chunk]
            end = offset[s.sid] + len(piece) == len(s.prompt)
            inputs.append(StepInput(s.sid, piece, logits_rows=[len(piece) - 1] if end else []))
            ends.append(end)
        outs = runner.step(inputs)
        runner.commit({inp.seq_id: list(range(len(inp.tokens))) for inp in inputs})
        for s, inp, out, end in zip(pending, inputs, outs, ends):
            offset[s.sid] += len(inp.tokens)
            if end:
                last[s.sid] = out[0]
        pending = [s for s in pending if offset[s.sid] < len(s.prompt)]
    return last


def make_runner(model: Transformer, prompts: list[list[int]], max_new_tokens: int, max_step_tokens: int = 256,
                block_size: int = 16) -> ModelRunner:
    """A runner whose cache fits the batch in the worst case, so generation cannot run out."""
    need = sum(-(-(len(p) + max_new_tokens + max_step_tokens) // block_size) for p in prompts)
    return ModelRunner(model, cache_tokens=need * block_size, block_size=block_size)


@torch.inference_mode()
def generate(
    model: Transformer,
    prompts: list[list[int]],
    proposer: Optional[Proposer] = None,
    max_new_tokens: int = 128,
    sampling: Optional[SamplingParams] = None,
    eos_token_ids: Optional[tuple[int, ...]] = None,
    runner: Optional[ModelRunner] = None,
    prefill_chunk: int = 512,
    progress: bool = False,
) -> list[GenerationResult]:
    """Generate for a batch of ragged prompts (lists of token ids) with one method.

    Greedy (default sampling) output is token-identical to plain greedy decoding whatever the
    proposer; with temperature > 0 every method samples exactly the target distribution.
    Each sequence has its own generator (seed, index), so a batch samples like single runs.
    """
    proposer = proposer or Proposer()
    sampling = sampling or SamplingParams()
    eos = set(model.cfg.eos_token_ids if eos_token_ids is None else eos_token_ids)
    check_prompts(prompts, max_new_tokens, model.cfg.max_position_embeddings, model.cfg.vocab_size)
    if prefill_chunk < 1:
        raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
    runner = runner or make_runner(model, prompts, max_new_tokens)

    seqs = []
    for i, p in enumerate(prompts):
        gen = None
        if sampling.seed is not None:
            gen = torch.Generator().manual_seed(sampling.seed * 1_000_003 + i)
        seqs.append(Sequence(sid=i, prompt=[int(t) for t in p], max_new_tokens=max_new_tokens, generator=gen))
    results = [None] * len(seqs)
    if max_new_tokens == 0:
        return [GenerationResult([], "length", len(s.prompt), s.stats) for s in seqs]

    added = []
    try:
        for s in seqs:
            runner.add_sequence(s.sid)
            added.append(s.sid)
        last = _prefill(runner, seqs, prefill_chunk)
        for s in seqs:
            probs = probs_from_logits(last[s.sid][None], sampling)[0]
            first = int(probs.argmax()) if sampling.greedy else sample(probs, s.generator)
            _append(s, [first], eos)
        proposer.start(seqs, runner, sampling)
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=sum(s.max_new_tokens for s in seqs), desc=f"generate[{proposer.name}]", leave=False)
            bar.update(len(seqs))
        while True:
            active = [s for s in seqs if s.finish is None]
            for s in seqs:
                if s.finish is not None and results[s.sid] is None:
                    results[s.sid] = GenerationResult(list(s.output), s.finish, len(s.prompt), s.stats)
                    proposer.finish(s)
                    runner.free(s.sid)
                    added.remove(s.sid)
            if not active:
                break
            # a step gains at most depth + 1 tokens; check_prompts keeps them inside the context
            max_depth = [s.remaining - 1 for s in active]
            trees = proposer.propose(active, max_depth)
            inputs, rows_of = [], []
            for s, tree in zip(active, trees):
                rows = [i for i in range(len(tree)) if tree.candidate[i] or i in tree.extra_logits]
                rows_of.append(rows)
                mask = None if tree.is_chain() else tree.mask()
                inputs.append(StepInput(s.sid, tree.tokens, tree.depths, mask, rows))
            outs = runner.step(inputs)
            commits, gained = {}, []
            for s, tree, rows, logits in zip(active, trees, rows_of, outs):
                row_index = {node: j for j, node in enumerate(rows)}
                if sampling.greedy:
                    nxt = logits.argmax(-1).tolist()
                    path, bonus = verify_greedy(tree, {node: nxt[j] for node, j in row_index.items()})
                else:
                    cand_rows = [j for node, j in row_index.items() if tree.candidate[node]]
                    probs = probs_from_logits(logits[cand_rows], sampling)
                    by_node = {rows[j]: probs[k] for k, j in enumerate(cand_rows)}
                    path, bonus = proposer.verify_sampling(s, tree, by_node)
                commits[s.sid] = path
                gained.append((path, [tree.tokens[n] for n in path[1:]] + [bonus]))
            runner.commit(commits)
            for s, tree, rows, logits, (path, new) in zip(active, trees, rows_of, outs, gained):
                st = s.stats
                st.forwards += 1
                st.step_tokens += len(tree)
                for node in range(1, len(tree)):
                    if tree.candidate[node]:
                        for bit, name in SOURCE_NAMES.items():
                            if tree.sources[node] & bit:
                                st.proposed[name] += 1
                                if node in path:
                                    st.accepted[name] += 1
                new = _append(s, new, eos)
                st.accepted_hist[len(new)] += 1
                proposer.observe(s, tree, rows, logits, path, new)
                if bar is not None:
                    bar.update(len(new))
        if bar is not None:
            bar.close()
    finally:
        for sid in added:  # an error mid-way must not leak cache blocks of a shared runner
            runner.free(sid)
    return results
