"""Prompt lookup decoding (Saxena 2023): drafts copied from earlier occurrences of the last
n-gram in the prompt and the sequence's own output, matched for the whole batch at once by
the ``ngram_match`` kernel."""

import weakref
from dataclasses import dataclass
from typing import Optional

import torch

from decoding import compiled_draft
from decoding.proposer import Budget, Context, Proposer, SeqState
from decoding.tree import PLD, StepTree
from kernels.ngram_match import ngram_match_lists as host_match_lists


@dataclass(slots=True)
class PromptLookupConfig:
    max_ngram: int = 3  # longest n-gram matched (tried first)
    min_ngram: int = 1  # shortest n-gram matched
    num_draft: int = 10  # continuation tokens per candidate (draft length)
    num_candidates: int = 1  # > 1: up to this many distinct continuations merged into a tree
    prefer: str = "first"  # "first" (earliest match, as the reference) or "recent"
    partial: bool = True  # accept continuations cut by the end of the history (as transformers)

    def __post_init__(self):
        if self.min_ngram < 1:
            raise ValueError(f"min_ngram must be >= 1, got {self.min_ngram}")
        if self.max_ngram < self.min_ngram:
            raise ValueError(f"max_ngram must be >= min_ngram ({self.min_ngram}), got {self.max_ngram}")
        if self.num_draft < 1:
            raise ValueError(f"num_draft (draft length) must be >= 1, got {self.num_draft}")
        if self.num_candidates < 1:
            raise ValueError(f"num_candidates must be >= 1, got {self.num_candidates}")
        if self.prefer not in ("first", "recent"):
            raise ValueError(f"prefer must be 'first' or 'recent', got {self.prefer!r}")


def lookup_candidates(backend, histories: list[list[int]], cfg: PromptLookupConfig,
                      device: torch.device | str = "cpu") -> list[list[list[int]]]:
    """Per history, its candidate continuations (best first) from one batched kernel call
    (the torch backend searches the lists on the host)."""
    return backend.ngram_match_lists(histories, device, **match_args(cfg))


def match_args(cfg: PromptLookupConfig) -> dict:
    """The n-gram search's arguments for ``cfg`` (the kernel's, a C history's)."""
    return dict(min_n=cfg.min_ngram, max_n=cfg.max_ngram, k=cfg.num_draft, num_candidates=cfg.num_candidates,
                prefer=cfg.prefer, partial=cfg.partial)


class DeviceHistories:
    """Each sequence's tokens mirrored on the device for the n-gram kernel. A step uploads
    only the tokens appended since the previous step (``SeqState.tokens`` only grows) and the
    batch's histories are joined on the device, so no step copies a whole history from the
    host. Entries go with their states (weak keys)."""

    def __init__(self):
        # state -> (device buffer, tokens uploaded, the last of them: a cheap check that the list only grew)
        self._mirror: "weakref.WeakKeyDictionary[SeqState, tuple[torch.Tensor, int, int]]" = weakref.WeakKeyDictionary()
        self.uploaded = 0  # tokens copied from the host so far (for tests and benchmarks)

    def pack(self, states: list[SeqState], device) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, cu_seqlens) of the states' histories back to back on ``device``."""
        device = torch.device(device)
        parts, lens = [], []
        for s in states:
            L = len(s.tokens)
            buf, n, last = self._mirror.get(s, (None, 0, None))
            if buf is not None and (buf.device != device or n > L or (n and s.tokens[n - 1] != last)):
                buf, n = None, 0  # another device, or not the list it was: upload it again
            if buf is None or buf.numel() < L:
                grown = torch.empty(max(2 * L, 64), dtype=torch.int32, device=device)
                if n:
                    grown[:n] = buf[:n]
                buf = grown
            if n < L:
                buf[n:L] = torch.tensor(s.tokens[n:L], dtype=torch.int32).to(device, non_blocking=True)
                self.uploaded += L - n
            self._mirror[s] = (buf, L, s.tokens[L - 1] if L else None)
            parts.append(buf[:L])
            lens.append(L)
        cu = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32).to(device, non_blocking=True)
        return (torch.cat(parts) if parts else torch.empty(0, dtype=torch.int32, device=device)), cu


# Batches whose histories hold at most this many tokens in all are searched on the host, whatever
# the backend: the host search (kernels.ngram_match.ngram_match_lists) takes about 0.02 ms per
# 1,000 history tokens on one x86 core, while the device kernel's round trip (upload of the new
# tokens, a launch, a synchronising copy back) cost 0.17 ms per step on an H200 at batch 1
# (bench/results/2026-11-26-h200-phases, "propose"). Larger batches go to the kernel.
HOST_SEARCH_TOKENS = 4096


def lookup_states(backend, states: list[SeqState], cfg: PromptLookupConfig, device: torch.device | str = "cpu",
                  mirror: Optional[DeviceHistories] = None, host: Optional["HostHistories"] = None
                  ) -> list[list[list[int]]]:
    """``lookup_candidates`` of the states' histories. With ``host`` (where the compiled
    drafting runs) the histories mirrored in C are searched there; else a backend whose
    kernel runs on the device reads them from ``mirror`` (kept there between steps) when one is
    given, unless the histories are short enough in all (``HOST_SEARCH_TOKENS``) to search
    faster on the host."""
    if host is not None and compiled_draft.enabled():
        return [host.of(s).search(**match_args(cfg)) for s in states]
    if mirror is None or backend.searches_on_host:
        return lookup_candidates(backend, [s.tokens for s in states], cfg, device)
    if sum(len(s.tokens) for s in states) <= HOST_SEARCH_TOKENS:
        return host_match_lists([s.tokens for s in states], **match_args(cfg))
    tokens, cu = mirror.pack(states, device)
    return backend.ngram_match_found(tokens, cu, **match_args(cfg))


class HostHistories:
    """Each sequence's tokens mirrored in C (``compiled_draft.CHistory``) for the compiled
    search, appended to with what the list gained since the last step (weak keys, as
    ``DeviceHistories``). The C search of a whole history took 2-5 us for 200-3,000 tokens on
    the 2-core Zen 4 (bench/results/2026-11-27-cpu-host-drafting/NOTES.md, "The twins alone"), against the
    device kernel's 0.17 ms round trip per step on an H200
    (bench/results/2026-11-26-h200-phases, "propose"), so the compiled path searches on the
    host on every device."""

    def __init__(self):
        # state -> [history, tokens mirrored, the last of them], the list updated in place (a weak
        # dictionary's assignment makes a weak reference each time)
        self._of: "weakref.WeakKeyDictionary[SeqState, list]" = weakref.WeakKeyDictionary()

    def of(self, state: SeqState) -> "compiled_draft.CHistory":
        tokens = state.tokens
        entry = self._of.get(state)
        if entry is None or entry[1] > len(tokens) or (entry[1] and tokens[entry[1] - 1] != entry[2]):
            entry = self._of[state] = [compiled_draft.CHistory(), 0, None]  # not the list it was: mirror it again
        hist, n = entry[0], entry[1]
        if n < len(tokens):
            hist.extend_from(tokens, n)
            entry[1], entry[2] = len(tokens), tokens[-1]
        return hist


def add_lookups(buf: "compiled_draft.TreeBuf", hist: "compiled_draft.CHistory", cfg: PromptLookupConfig,
                max_depth: int, max_nodes: int) -> None:
    """The compiled ``add_chain`` of every continuation the history's search finds (in order,
    cut to ``max_depth``) into the tree ``buf`` holds."""
    hist.add_to_tree(buf, max_depth=max_depth, max_nodes=max_nodes, source=PLD, **match_args(cfg))


class PromptLookup(Proposer[SeqState]):
    name = "pld"
    sources = PLD

    def __init__(self, cfg: PromptLookupConfig | None = None):
        self.cfg = cfg or PromptLookupConfig()
        self.histories = DeviceHistories()
        # the compiled drafting: its tree buffer and the histories in C (None: the reference drafts)
        self.buf = compiled_draft.TreeBuf() if compiled_draft.enabled() else None
        self.host = HostHistories()
        # the parts of a tree drafted in one call (TreeBuf.draft): prompt lookup's, each
        # sequence's history set before its call
        self.parts = None
        if self.buf is not None:
            self.parts = compiled_draft.draft_sources()
            self.parts.set_history(compiled_draft.CHistory(), **match_args(self.cfg))

    def propose(self, states: list[SeqState], budgets: list[Budget], ctx: Context) -> list[StepTree]:
        if self.buf is not None:
            buf, parts, trees, bound = self.buf, self.parts, [], self.cfg.num_candidates * self.cfg.num_draft
            for s, b in zip(states, budgets):
                cap = min(b.max_nodes, bound) + 1
                if cap > buf.cap:  # buf.ensure, only where it grows (each call is a step's cost)
                    buf.ensure(cap)
                if b.max_depth > 0:  # add_lookups in one call of the library
                    hist = self.host.of(s)
                    parts.hist, parts.keep["hist"] = hist._h, hist  # set_history's handle, its arguments set once
                buf.draft(parts, s.tokens[-1], b.max_depth, max(b.max_nodes, 0), 0, None)  # s.root
                trees.append(buf.step_tree())
            return trees
        trees = [StepTree.root(s.root) for s in states]
        todo = [i for i, b in enumerate(budgets) if b.max_depth > 0]
        if todo:
            found = lookup_states(ctx.backend, [states[i] for i in todo], self.cfg, ctx.device, self.histories)
            for i, chains in zip(todo, found):
                for chain in chains:
                    trees[i].add_chain(chain[:budgets[i].max_depth], PLD, budgets[i].max_nodes)
        return trees
