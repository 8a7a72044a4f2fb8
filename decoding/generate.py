"""One generate loop for every method, over a batch of ragged sequences.

Per step every active sequence gets a ``StepTree`` from the method's proposer (root = its
last token, candidate nodes, maybe private lookahead-window nodes); all trees go through
the model in ONE forward; each sequence then accepts its own number of tokens, commits
their K/V, and stops on EOS (inside an accepted draft too) or at exactly max_new_tokens.
The contract between this loop and a method is in ``decoding/proposer.py``.
"""

import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from decoding import compiled, inputs
from decoding.planner import Planner
from decoding.proposer import Budget, Context, Outcome, Proposer, Sequence, SeqState
from decoding.sampling import SamplingParams, probs_from_logits, sample
from decoding.stats import SeqStats, StepClock
from decoding.tree import SOURCE_NAMES, StepTree
from decoding.verify import greedy_path
from models.llama import Transformer
from models.runner import ModelRunner, StepInput


@dataclass
class GenerationResult:
    output_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    stats: SeqStats


def check_prompts(prompts: list[list[int]], max_new_tokens: int, context: int, vocab: int) -> None:
    inputs.at_least(max_new_tokens, "max_new_tokens", 0)
    if isinstance(prompts, str) or not hasattr(prompts, "__len__"):
        raise ValueError(f"prompts must be a list of prompts, each a list of token ids, got {type(prompts).__name__}"
                         + ("; text goes to TextGenerator.generate" if isinstance(prompts, str) else ""))
    if not len(prompts):
        raise ValueError("prompts is empty: give at least one prompt")
    for i, p in enumerate(prompts):
        if isinstance(p, str) or not hasattr(p, "__len__"):
            raise ValueError(f"prompt {i} must be a list of token ids, got {type(p).__name__}"
                             + ("; text goes to TextGenerator.generate" if isinstance(p, str) else
                                " (one prompt is [ids]: a list of one list)" if hasattr(p, "__index__") else ""))
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty: a prompt needs at least one token")
        if len(p) + max_new_tokens > context:
            raise ValueError(f"prompt {i} has {len(p)} tokens; with max_new_tokens={max_new_tokens} it needs "
                             f"{len(p) + max_new_tokens} positions, the model context is {context}")
        odd = [t for t in p if isinstance(t, (bool, float, str)) or not hasattr(t, "__index__")]
        if odd:
            raise ValueError(f"prompt {i}: token ids must be integers, got {odd[0]!r}")
        bad = [t for t in p if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"prompt {i}: token ids must be in [0, {vocab}), got {bad[:3]}")


# Prompt tokens per sequence per prefill forward (generate's default). On the 2-core CPU a
# 1,000-2,000-token prompt's prefill is 2-4% faster in one chunk of 2,048 than in chunks of 512
# (the products run more rows at a time; the prefill kernel attends a later chunk's prefix as
# fast as its own rows: bench/results/2026-11-27-cpu-prefill-kernel/NOTES.md; with SDPA, which
# took the prefix through an explicit mask, it was 4-11%). The GPU keeps 512: not measured there.
PREFILL_CHUNK = 512
PREFILL_CHUNK_CPU = 2048


def default_prefill_chunk(device) -> int:
    """generate's prefill chunk on ``device`` when none is given."""
    return PREFILL_CHUNK_CPU if torch.device(device).type == "cpu" else PREFILL_CHUNK


@torch.inference_mode()
def generate(
    model: Transformer,
    prompts: list[list[int]],
    proposer: Optional[Proposer] = None,
    *,
    max_new_tokens: int = 128,
    sampling: Optional[SamplingParams] = None,
    eos_token_ids: Optional[tuple[int, ...]] = None,
    planner: Optional[Planner] = None,
    runner: Optional[ModelRunner] = None,
    prefill_chunk: Optional[int] = None,
    progress: bool = False,
    on_tokens: Optional[Callable[[int, list[int]], bool]] = None,
    step_clock: Optional[StepClock] = None,
) -> list[GenerationResult]:
    """Generate for a batch of ragged prompts (lists of token ids) with one method.

    Greedy (default sampling) output is token-identical to plain greedy decoding whatever the
    proposer, as far as a many-row step's logits equal a one-row step's (in fp32; in 16-bit
    dtypes their rounding may differ: docs/DESIGN.md, "Verification"); with temperature > 0
    every method samples exactly the target distribution. Each sequence has its own generator (seed,
    index), so a batch samples like single runs. ``planner`` (one per call) sizes every step to what
    it costs on the device; without one, each step sends the proposer's whole tree.
    ``on_tokens(index, new_tokens)`` is called whenever sequence ``index`` gains tokens (streaming);
    returning True stops that sequence (finish reason "stop", e.g. a stop string was reached).
    ``step_clock`` (a ``decoding.stats.StepClock``) sums where the decoding steps' time goes, phase
    by phase. A KeyboardInterrupt on the way goes on up with ``partial``: a result per prompt of
    what it had (finish reason "interrupted" where it had not finished).
    """
    proposer, sampling, prefill_chunk = _checked(model, proposer, sampling, step_clock, prefill_chunk)
    eos = set(model.cfg.eos_token_ids if eos_token_ids is None else eos_token_ids)
    check_prompts(prompts, max_new_tokens, model.cfg.max_position_embeddings, model.cfg.vocab_size)
    proposer.check(model)  # before the prefill: nothing generated (or streamed) yet
    runner = runner or ModelRunner.for_batch(model, prompts, max_new_tokens)
    seqs = [Sequence(SeqState(i, [int(t) for t in p], len(p), _generator(sampling, i, runner.device)), max_new_tokens)
            for i, p in enumerate(prompts)]
    if max_new_tokens == 0:
        return [GenerationResult([], "length", len(s.state.tokens), s.stats) for s in seqs]
    ctx = Context(backend=model.backend, device=runner.device, max_context=runner.max_context,
                  vocab_size=model.cfg.vocab_size, max_new_tokens=max_new_tokens, sampling=sampling)
    batch = _Batch(runner, proposer, seqs)
    try:
        batch.prefill(prefill_chunk, sampling, eos)
        if on_tokens is not None:
            _notify(on_tokens, seqs, [s.output for s in seqs])
        proposer.begin([s.state for s in seqs], ctx)
        bar = _progress_bar(progress, proposer.name, seqs)
        while active := batch.retire_finished():
            t0 = time.perf_counter()
            outcomes = decode_step(runner, proposer, active, ctx, eos, planner, step_clock, batch.glue)
            gained, sent, sids = record(active, outcomes, batch.glue)  # each sequence's statistics
            if planner is not None:  # what the step's trees taught, and its time
                planner.observe_step(sids, outcomes, sent, (time.perf_counter() - t0) * 1e3, gained, proposer.model_ms)
            if on_tokens is not None:
                _notify(on_tokens, active, [o.new_tokens for o in outcomes])
            bar.update(gained)
            if step_clock is not None:
                step_clock.mark("update")
        bar.close()
    except KeyboardInterrupt as e:
        e.partial = _partial(seqs)  # for the entry point to report (python -m decoding's stats line)
        raise
    finally:
        batch.release()  # an error mid-way must not leak cache blocks of a shared runner
    return batch.results


def _partial(seqs: list[Sequence]) -> list[GenerationResult]:
    """Each sequence as Ctrl-C (or SIGTERM: decoding/interrupt.py) found it: its tokens and
    statistics so far, finish reason "interrupted" where it had not finished."""
    return [GenerationResult(s.output, s.finish or "interrupted", s.state.prompt_len, s.stats) for s in seqs]


def _checked(model: Transformer, proposer, sampling, step_clock, prefill_chunk) -> tuple:
    """generate's arguments checked (each named with what it takes) and defaulted: (proposer,
    sampling, prefill_chunk)."""
    proposer = proposer or Proposer()
    if not isinstance(proposer, Proposer):
        inputs.fail("proposer", proposer, "a Proposer (make_proposer(NAME)) or None")
    if sampling is not None and not isinstance(sampling, SamplingParams):
        inputs.fail("sampling", sampling, "a SamplingParams (e.g. SamplingParams(temperature=0.7, seed=0)) or None")
    if step_clock is not None and not isinstance(step_clock, StepClock):
        inputs.fail("step_clock", step_clock, "a decoding.stats.StepClock or None")
    if prefill_chunk is None:
        prefill_chunk = default_prefill_chunk(model.device)
    if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1:
        raise ValueError(f"prefill_chunk must be an integer >= 1 (None: the device's default), got {prefill_chunk!r}")
    return proposer, sampling or SamplingParams(), prefill_chunk


def decode_step(runner: ModelRunner, proposer: Proposer, active: list[Sequence], ctx: Context,
                eos: set[int], planner: Optional[Planner] = None, clock: Optional[StepClock] = None,
                glue=None) -> list[Outcome]:
    """One step of every active sequence: propose -> (plan) -> forward -> verify -> commit ->
    update. A planner sends a subtree of each proposed tree; outcomes name the proposer's nodes
    (the caller has the planner learn from them: ``Planner.observe_step``, with the step's time).
    ``clock`` is told when each phase ends; ``glue``: the compiled twins of ``send``, the greedy
    walks and ``settle`` (``compiled.glue()``).

    Written as plain loops, one per phase, calling the greedy walk directly for a proposer that
    keeps the common ``verify``: in this Python each comprehension and each function is a code object
    of its own, and after a forward every one the step touches costs its lines from memory
    (bench/results/2026-11-28-cpu-cold-host/NOTES.md)."""
    mark = _no_mark
    if clock is not None:
        clock.start(runner.device)
        mark = clock.mark
    states, sids, depth, contexts = [], [], [], []
    for s in active:
        st = s.state
        states.append(st)
        sids.append(st.sid)
        depth.append(s.max_new_tokens - (len(st.tokens) - st.prompt_len) - 1)  # s.remaining - 1
        contexts.append(len(st.tokens) - 1)  # st.committed
    budgets = []
    if planner is None:
        for d in depth:
            budgets.append(Budget(max_depth=d))
    elif proposer.sizes_itself:
        for d, t in zip(depth, planner.step_times(sids, contexts)):
            budgets.append(Budget(max_depth=d, step_ms=t, planned=True))
    else:
        for d, p in zip(depth, planner.max_depth(sids, proposer.sources, contexts)):
            budgets.append(Budget(max_depth=min(d, p), planned=True))
    mark("plan")
    trees = proposer.propose(states, budgets, ctx)
    mark("propose")
    keep = None if planner is None else planner.select(sids, trees)
    sent, rows, inputs = send(sids, trees, keep, glue)
    mark("plan")
    greedy = ctx.sampling.temperature == 0.0  # ctx.sampling.greedy, written out
    if greedy:  # the argmax / top-k of every row, and the logits only if asked for
        reduced = runner.step_greedy(inputs, proposer.top_k, None if clock is None else mark)
    else:
        reduced = [(lg, None, None) for lg in runner.step(inputs, None if clock is None else mark)]
    # the common rule, not overridden by the proposer's class or on the object itself
    own = greedy and getattr(proposer.verify, "__func__", None) is Proposer.verify
    verdicts = glue.paths(sent, rows, reduced) if own and glue is not None else None  # greedy_path's, in one call
    if verdicts is None:
        verdicts = []
        for st, t, r, (lg, top1, _) in zip(states, sent, rows, reduced):
            if own:  # verify's greedy rule, called directly
                verdicts.append(greedy_path(t, r, top1))
            else:
                verdicts.append(proposer.verify(st, t, lg, r, ctx.sampling, top1=top1))  # top1: None when sampling
    mark("verify")
    accepted = {}
    for sid, (path, _) in zip(sids, verdicts):
        accepted[sid] = path
    runner.commit(accepted)
    mark("commit")
    outcomes = settle(proposer, active, trees, sent, rows, verdicts, reduced, keep, eos, glue)
    mark("update")
    return outcomes


def settle(proposer: Proposer, active: list[Sequence], trees: list[StepTree], sent: list[StepTree],
           rows: list[dict[int, int]], verdicts: list[tuple], reduced: list[tuple], keep: Optional[list[list[int]]],
           eos: set[int], glue=None) -> list[Outcome]:
    """Each sequence's step settled, sequence by sequence: the accepted drafts' tokens and the
    bonus appended (cut at EOS or the sequence's length), the outcome named in the proposer's
    nodes (a sent subtree's path and rows renamed) and the proposer's ``update`` with it.
    ``glue.outcomes`` (decoding/cpu/glue_step.c) does the same in one call where every sequence
    is a plain ``Sequence`` (tests/test_compiled_step.py); the loop below is the reference."""
    learns = getattr(proposer.update, "__func__", None) is not Proposer.update  # ar, pld: nothing
    if glue is not None and (out := glue.outcomes(active, trees, sent, rows, verdicts, reduced, keep, eos, Sequence,
                                                  _MAKE_OUTCOME, proposer.update if learns else None)) is not None:
        return out
    outcomes = []
    for b, (s, tree, t, r, (path, bonus), (lg, top1, topk)) in enumerate(zip(active, trees, sent, rows, verdicts,
                                                                            reduced)):
        tokens, gained = t.tokens, []
        for n in path[1:]:
            gained.append(tokens[n])
        gained.append(bonus)
        new = s.append(gained, eos)
        if keep is not None and len(keep[b]) != len(tree.tokens):  # the sent subtree's nodes named as the proposer's
            k, named, renamed = keep[b], [], {}
            for n in path:
                named.append(k[n])
            for n, j in r.items():
                renamed[k[n]] = j
            path, r = named, renamed
        outcome = Outcome(tree=tree, path=path, new_tokens=new, logits=lg, rows=r, sent=len(tokens))
        outcome._top1, outcome._topk = top1, topk  # Outcome.reduced, written out
        outcomes.append(outcome)
        if learns:
            proposer.update(s.state, outcome)
    return outcomes


# how the glue makes the step's objects (compiled.maker: the dataclasses' fields set in C)
_MAKE_TREE, _MAKE_INPUT, _MAKE_OUTCOME = compiled.maker(StepTree), compiled.maker(StepInput), compiled.maker(Outcome)


def send(sids: list[int], trees: list[StepTree], keep: Optional[list[list[int]]], glue=None
         ) -> tuple[list[StepTree], list[dict[int, int]], list[StepInput]]:
    """What a step sends for each sequence: the tree (the proposer's, or its subtree of the nodes
    ``keep`` names where that drops any), its nodes' logits rows (node -> row: the candidates and
    the private nodes the proposer asked for) and the runner's input. The loop below is the
    reference; ``glue.send`` (decoding/cpu/glue_step.c) builds the same objects in one call
    (tests/test_compiled_step.py), where a step's few Python calls each paid their lines from
    memory after the forward (bench/results/2026-11-28-cpu-elementwise/NOTES.md)."""
    if glue is not None and (out := glue.send(trees, keep, sids, _MAKE_TREE, _MAKE_INPUT)) is not None:
        return out
    sent, rows, inputs = [], [], []
    for b, t in enumerate(trees):  # plain loops: see decode_step
        if keep is not None and len(keep[b]) != len(t.tokens):
            t = t.subtree(keep[b])[0]
        sent.append(t)
        r = {}  # node -> its logits row
        for node in t.logit_nodes():
            r[node] = len(r)
        rows.append(r)
        inputs.append(StepInput(sids[b], t.tokens, t.depths, None, list(r), None if t.is_chain() else t.parents))
    return sent, rows, inputs


def record(active: list[Sequence], outcomes: list[Outcome], glue=None) -> tuple[int, list[int], list[int]]:
    """Each sequence's statistics of the step (``SeqStats.record``); returns the tokens the step
    gained, the query tokens it sent per sequence and the sequences' ids (what the planner learns
    from). ``glue.record`` (decoding/cpu/glue_step.c) does the same in one call where every
    sequence keeps a plain ``SeqStats``; the loop below is the reference."""
    if glue is not None and (out := glue.record(active, outcomes, SeqStats, SOURCE_NAMES)) is not None:
        return out
    gained, sent, sids = 0, [], []  # plain loops: see decode_step
    for s, o in zip(active, outcomes):
        s.stats.record(o)
        gained += len(o.new_tokens)
        sent.append(o.sent)
        sids.append(s.state.sid)
    return gained, sent, sids


def _no_mark(phase: str) -> None:
    pass


def _notify(on_tokens, seqs: list[Sequence], new: list[list[int]]) -> None:
    for s, tokens in zip(seqs, new):
        if tokens and on_tokens(s.state.sid, list(tokens)) and s.finish is None:
            s.finish = "stop"


def _generator(sampling: SamplingParams, index: int, device: torch.device) -> Optional[torch.Generator]:
    """Sequence ``index``'s generator, on the device its probabilities live on (a CPU
    generator cannot draw from CUDA tensors)."""
    if sampling.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(sampling.seed * 1_000_003 + index)


class _Batch:
    """The batch's sequences in the runner's cache: prefill, retiring finished sequences, and
    giving back whatever is left when generation stops (normally or by an error)."""

    def __init__(self, runner: ModelRunner, proposer: Proposer, seqs: list[Sequence]):
        self.runner, self.proposer, self.seqs = runner, proposer, seqs
        self.glue = compiled.glue() if compiled.enabled() else None  # the step's compiled glue, if any
        self.results: list[Optional[GenerationResult]] = [None] * len(seqs)
        self.live: list[Sequence] = []
        for s in seqs:
            runner.add_sequence(s.state.sid)
            self.live.append(s)

    def prefill(self, chunk: int, sampling: SamplingParams, eos: set[int]) -> None:
        """Causal steps over the prompts, ``chunk`` tokens per sequence per forward, then the
        first token of each sequence from its last prompt row."""
        done = {s.state.sid: 0 for s in self.seqs}
        pending = list(self.seqs)
        while pending:
            inputs = []
            for s in pending:
                start = done[s.state.sid]
                piece = s.state.tokens[start:start + chunk]
                last = start + len(piece) == s.state.prompt_len
                inputs.append(StepInput(s.state.sid, piece, logits_rows=[len(piece) - 1] if last else []))
            outs = self.runner.step(inputs)
            self.runner.commit({inp.seq_id: list(range(len(inp.tokens))) for inp in inputs})
            for s, inp, out in zip(pending, inputs, outs):
                done[s.state.sid] += len(inp.tokens)
                if done[s.state.sid] == s.state.prompt_len:
                    probs = probs_from_logits(out, sampling)[0]
                    s.append([int(probs.argmax()) if sampling.greedy else sample(probs, s.state.generator)], eos)
                    s.state = self.proposer.init_state(s.state)
            pending = [s for s in pending if done[s.state.sid] < s.state.prompt_len]

    def retire_finished(self) -> list[Sequence]:
        """Record and free the sequences that finished; return the active ones."""
        live = []
        for s in list(self.live):  # a plain loop: see decode_step
            if s.finish is None:
                live.append(s)
            else:
                self.results[s.state.sid] = GenerationResult(s.output, s.finish, s.state.prompt_len, s.stats)
                self._drop(s)
        return live

    def release(self) -> None:
        for s in list(self.live):
            self._drop(s)

    def _drop(self, s: Sequence) -> None:
        self.live.remove(s)
        self.proposer.end(s.state)
        self.runner.free(s.state.sid)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(on: bool, name: str, seqs: list[Sequence]):
    if not on:
        return _NoBar()
    from tqdm import tqdm
    bar = tqdm(total=sum(s.max_new_tokens for s in seqs), desc=f"generate[{name}]", leave=False)
    bar.update(len(seqs))  # the first tokens came from the prefill
    return bar
