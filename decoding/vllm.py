"""Our token-only drafters inside vLLM: a speculative proposer for vLLM's ``method: custom_class``.

    from vllm import LLM
    from decoding.vllm import vllm_model_folder
    llm = LLM(model=str(vllm_model_folder()), speculative_config={
        "method": "custom_class", "model": "decoding.vllm.HybridProposer", "num_speculative_tokens": 10})

Four drafters need nothing but the tokens, so they run beside any engine: prompt lookup
(``PromptLookupProposer``), the suffix trie with the store shared by the requests of the
engine (``SuffixProposer``), both in one tree (``HybridProposer``: the request's own suffix
continuations first, then prompt lookup, then the shared store, the order of our ``hybrid``),
and the context mixture (``MixProposer``, decoding/context_mix.py: every context length of the
request's text and of the shared store, weighted by learned reliability, matched again at each
token of the chain). vLLM verifies one chain per request and step. The tree drafters send the
chain of their tree with the most expected accepted tokens by our acceptance estimates
(decoding/planner.py: per source, depth and sibling rank, learned per request and smoothed
towards the engine's); the mixture drafts its chain a token at a time. Either is at most
``num_speculative_tokens`` long and cut where its chance of acceptance falls below
``min_chance`` (its first token is always sent, so the estimates keep learning).

vLLM hands the proposer each row's whole token context and nothing that names the request, so
a request is followed by its tokens: a row whose context extends the tokens a request had is
that request (rows move when others finish); any other is a new request. A request no row
continues has finished: its text goes into the shared store. What the previous chain of a
request gained is read from the tokens its next call brings (the accepted drafts and the bonus
token), and the estimates learn from it.

vLLM is imported nowhere here: this module loads without it (the proposer gets vLLM's config
object and reads two fields of it), and tests drive it with a fake call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from decoding.context_mix import ContextMix, MixConfig
from decoding.planner import Acceptance, AcceptKey, PlannerConfig, node_estimates, node_keys
from decoding import compiled_draft
from decoding.prompt_lookup import HostHistories, PromptLookupConfig, add_lookups, lookup_candidates
from decoding.suffix import SuffixConfig, SuffixState, SuffixStore, SuffixTrie, compiled_with, grow_tree, new_trie, sync
from decoding.tree import PLD, SUFFIX, StepTree

if TYPE_CHECKING:  # only for the annotations: vLLM lives in its own venv (make vllm)
    from vllm.config import VllmConfig

DRAFTERS = ("pld", "suffix", "hybrid", "mix")
# the mixture's probabilities run above what is accepted (its chains sent 7.6 tokens per forward at
# 0.02 where the hybrid's sent 5.5): its bar is higher, chosen on the dev split by tokens per forward
# against tokens sent. Inside vLLM on the CPU the hybrid at 0.1 was slower than at 0.02 (more
# forwards, none cheaper): bench/results/2026-11-26-cpu-context-mix/NOTES.md
DEFAULT_MIN_CHANCE = {"pld": 0.02, "suffix": 0.02, "hybrid": 0.02, "mix": 0.2}


@dataclass(slots=True)
class VllmDrafterConfig:
    drafter: str = "hybrid"  # one of DRAFTERS
    pld: PromptLookupConfig = field(default_factory=PromptLookupConfig)
    # the shared store is what a serving engine has and a single request lacks: on by default
    suffix: SuffixConfig = field(default_factory=lambda: SuffixConfig(shared=True))
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    mix: MixConfig = field(default_factory=MixConfig)  # the mix drafter's context mixture
    # a chain stops before its first node less likely than this to be accepted (None: the drafter's
    # default, DEFAULT_MIN_CHANCE). A low bar for the tree drafters, whose chances come from
    # acceptance estimates: on this CPU a token verified costs vLLM a small part of a forward (a
    # 135M model reads its weights once per step); raise it where each token sent is dear
    min_chance: Optional[float] = None
    max_nodes: int = 64  # candidate nodes of the tree a chain is chosen from

    def __post_init__(self):
        if self.drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}, got {self.drafter!r}")
        if self.min_chance is None:
            self.min_chance = DEFAULT_MIN_CHANCE[self.drafter]
        if not 0.0 <= self.min_chance < 1.0:
            raise ValueError(f"min_chance must be in [0, 1), got {self.min_chance}")
        if self.max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {self.max_nodes}")
        if self.mix.max_context >= self.suffix.depth:
            raise ValueError(f"mix.max_context must be below suffix.depth ({self.suffix.depth}), got "
                             f"{self.mix.max_context}")


def best_chain(tree: StepTree, probs: Sequence[float], max_len: int, min_chance: float = 0.0) -> list[int]:
    """The nodes (root excluded, root side first) of the path from the root with the most
    expected accepted tokens, the sum of its nodes' chances ``probs`` (each the chance that the
    node and its ancestors are accepted), at most ``max_len`` nodes; nodes below ``min_chance``
    are never taken (a node's chance is at most its parent's, so they end a path). Ties: the
    earlier sibling (the higher ranked)."""
    if max_len < 0:
        raise ValueError(f"max_len must be >= 0, got {max_len}")
    n = len(tree)
    # value[v]: best expected tokens of a path from v down (v included), at most max_len - depth(v) + 1 nodes
    value, nxt = [0.0] * n, [-1] * n
    for v in range(n - 1, -1, -1):  # children come after their parents
        if v and (tree.depths[v] > max_len or probs[v] < min_chance or not tree.candidate[v]):
            value[v] = float("-inf")
            continue
        best, pick = 0.0, -1
        for c in tree.children[v].values():
            if value[c] > best:
                best, pick = value[c], c
        value[v], nxt[v] = (probs[v] if v else 0.0) + best, pick
    chain, v = [], nxt[0]
    while v >= 0:
        chain.append(v)
        v = nxt[v]
    return chain


@dataclass(eq=False, kw_only=True)
class _Request(SuffixState):
    """One request as the proposer follows it (``SuffixState``: its tokens and its own trie)."""

    acc: Acceptance
    buf: np.ndarray  # its tokens as an array: a row is matched against it
    sent: list[int] = field(default_factory=list)  # the chain drafted last step
    keys: list[list[AcceptKey]] = field(default_factory=list)  # that chain's nodes' estimate keys


class TokenDrafter:
    """The proposer without vLLM: rows of token contexts in, one draft chain per row out."""

    def __init__(self, cfg: Optional[VllmDrafterConfig] = None, *, num_speculative_tokens: int,
                 max_model_len: int):
        from kernels.backend import get_backend

        self.cfg = cfg or VllmDrafterConfig()
        if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) \
                or num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {num_speculative_tokens!r}")
        if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 2:
            raise ValueError(f"max_model_len must be an integer >= 2, got {max_model_len!r}")
        self.k, self.max_model_len = num_speculative_tokens, max_model_len
        self.backend = get_backend("torch")  # prompt lookup's host search (the C byte search)
        sc = self.cfg.suffix
        use_suffix = self.cfg.drafter in ("suffix", "hybrid", "mix")
        self.store = SuffixStore(sc.depth, sc.store_nodes) if use_suffix and sc.shared else None
        self.shared = Acceptance(self.cfg.planner)  # the engine's estimate, each request's prior
        self.mix = ContextMix(self.cfg.mix) if self.cfg.drafter == "mix" else None  # one table per engine
        self.live: dict[int, _Request] = {}  # row -> the request it held at the last call
        # the compiled drafting (decoding/compiled_draft.py): its tree buffer and the requests'
        # histories in C; None: the Python reference drafts (the context mixture always does)
        self.buf = compiled_draft.TreeBuf() if self.mix is None and compiled_with(self.store) else None
        self.host = HostHistories()
        self._next_sid = 0
        # totals, for tests and the benchmark: calls, chains drafted, draft tokens, accepted
        self.stats = dict(calls=0, drafts=0, draft_tokens=0, accepted=0, requests=0)

    # ---- following requests ------------------------------------------------------------------
    def _continues(self, req: _Request, row: np.ndarray, n: int) -> bool:
        m = len(req.tokens)
        return m <= n and np.array_equal(row[:m], req.buf[:m])

    def _new(self, row: np.ndarray, n: int, sampled: int) -> _Request:
        tokens = [int(x) for x in row[:n]]
        buf = np.empty(max(2 * n, 64), dtype=np.int64)
        buf[:n] = row[:n]
        req = _Request(sid=self._next_sid, tokens=tokens, prompt_len=max(n - sampled, 0),
                       trie=new_trie(self.cfg.suffix.depth, compiled=self.buf is not None),
                       acc=Acceptance(self.cfg.planner, self.shared), buf=buf)
        self._next_sid += 1
        self.stats["requests"] += 1
        if self.cfg.drafter != "pld":
            sync(req)
        return req

    def _extend(self, req: _Request, row: np.ndarray, n: int) -> None:
        """Append what the request gained since its last call; learn from its last chain."""
        m = len(req.tokens)
        gained = [int(x) for x in row[m:n]]
        if len(req.buf) < n:
            grown = np.empty(2 * n, dtype=np.int64)
            grown[:m] = req.buf[:m]
            req.buf = grown
        req.buf[m:n] = row[m:n]
        req.tokens.extend(gained)
        if self.mix is not None:
            self._learn(req)
        elif self.cfg.drafter != "pld":
            sync(req)
        if req.sent:
            # gained = the accepted drafts, then the target's own token (the bonus)
            a = 0
            while a < min(len(req.sent), len(gained) - 1) and gained[a] == req.sent[a]:
                a += 1
            for j, keys in enumerate(req.keys[:a + 1]):  # the first rejected node was tried too
                for key in keys:
                    req.acc.record(key, j < a)
            req.acc.streak = a > 0
            self.stats["accepted"] += a
        req.sent, req.keys = [], []

    def _learn(self, req: _Request) -> None:
        """Index the tokens the request gained one at a time, the mixture learning from each
        before the request's trie holds it."""
        tokens, trie, w = req.tokens, req.trie, self.cfg.mix.max_context
        tries = self._tries(req)
        for pos in range(max(req.indexed, 1), len(tokens)):
            self.mix.learn(tries, tokens[max(pos - w, 0):pos], tokens[pos])
            trie.extend(tokens[pos:pos + 1])
        req.indexed = len(tokens)

    def _tries(self, req: _Request) -> list[Optional[SuffixTrie]]:
        return [req.trie, self.store.trie if self.store is not None else None]

    def _end(self, req: _Request) -> None:
        if self.store is not None:
            self.store.add(req.tokens)

    # ---- drafting -------------------------------------------------------------------------------
    def tree(self, req: _Request, depth: int) -> StepTree:
        """Our tree for the request: its own suffix continuations, prompt lookup, the shared store."""
        if self.buf is not None:
            return self._tree_compiled(req, depth)
        cfg = self.cfg
        tree = StepTree.root(req.tokens[-1])
        cap = cfg.max_nodes
        if depth < 1:
            return tree
        if cfg.drafter in ("suffix", "hybrid"):
            match = req.trie.own_match(cfg.suffix.max_match)
            if match is not None:
                grow_tree(tree, req.trie, match, depth, min(cap, cfg.suffix.max_nodes), cfg.suffix.min_prob)
        if cfg.drafter in ("pld", "hybrid"):
            for chain in lookup_candidates(self.backend, [req.tokens], cfg.pld)[0]:
                tree.add_chain(chain[:depth], PLD, cap)
        if self.store is not None:  # keyed as SUFFIX, not STORE as in our engine: for the chain replayed
            # on the dev and test splits the two keys were within 0.3% of each other's tau (hybrid)
            shared = self.store.trie.store_match(req.tokens, cfg.suffix.max_match)
            if shared is not None:
                grow_tree(tree, self.store.trie, shared, depth, cap, cfg.suffix.min_prob)
        return tree

    def _tree_compiled(self, req: _Request, depth: int) -> StepTree:
        """``tree`` built in C from the request's compiled trie and history, in the same order."""
        cfg, buf, cap = self.cfg, self.buf, self.cfg.max_nodes
        buf.start(req.tokens[-1], cap + 1)
        if depth >= 1:
            if cfg.drafter in ("suffix", "hybrid"):
                match = req.trie.own_match(cfg.suffix.max_match)
                if match is not None:
                    req.trie.grow(buf, match, depth, min(cap, cfg.suffix.max_nodes), cfg.suffix.min_prob, SUFFIX)
            if cfg.drafter in ("pld", "hybrid"):
                add_lookups(buf, self.host.of(req), cfg.pld, depth, cap)
            if self.store is not None:
                shared = self.store.trie.store_match(req.tokens[-cfg.suffix.max_match:], cfg.suffix.max_match)
                if shared is not None:
                    self.store.trie.grow(buf, shared, depth, cap, cfg.suffix.min_prob, SUFFIX)
        return buf.step_tree()

    def draft(self, req: _Request, depth: int) -> list[int]:
        """The chain sent for the request this step (its keys kept to learn from next call)."""
        if self.mix is not None:  # learns from the request's tokens, not from its chains: no keys
            req.sent, req.keys = self.mix.chain(self._tries(req), req.tokens, depth, self.cfg.min_chance), []
        else:
            tree = self.tree(req, depth)
            if len(tree) == 1:
                return []
            probs, _ = node_estimates(tree, req.acc)
            # a chain cut to nothing still sends its best first node: the estimates learn only from
            # what is sent, so a request whose estimates fell below the bar would otherwise never
            # draft again (replayed on the dev split, min_chance 0.1 gave tau 1.01 without this and
            # 2.04 with it: bench/results/2026-11-26-cpu-vllm-replay/NOTES.md)
            nodes = best_chain(tree, probs, depth, self.cfg.min_chance) or best_chain(tree, probs, 1)
            req.sent = [tree.tokens[v] for v in nodes]
            req.keys = [node_keys(tree, v, req.acc.streak) for v in nodes]
        if req.sent:
            self.stats["drafts"] += 1
            self.stats["draft_tokens"] += len(req.sent)
        return req.sent

    def propose_rows(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: Sequence[int],
                     token_ids_cpu: np.ndarray) -> list[list[int]]:
        """Per row: ``num_tokens_no_spec[i]`` tokens of ``token_ids_cpu[i]`` are its context, the
        tokens sampled this step last; a row without sampled tokens (a prefill still in chunks)
        gets no draft."""
        self.stats["calls"] += 1
        previous, self.live = self.live, {}
        claimed: dict[int, _Request] = {}  # id -> request continued by a row of this call
        found: list[Optional[_Request]] = []
        for i, sampled in enumerate(sampled_token_ids):
            req = None
            if len(sampled):
                n, row = int(num_tokens_no_spec[i]), token_ids_cpu[i]
                req = previous.get(i)
                if req is None or id(req) in claimed or not self._continues(req, row, n):
                    req = next((r for r in previous.values()
                                if id(r) not in claimed and self._continues(r, row, n)), None)
                if req is not None:
                    claimed[id(req)] = req
            found.append(req)
        # no row continues them: finished, and into the shared store before this call drafts
        for req in {id(r): r for r in previous.values() if id(r) not in claimed}.values():
            self._end(req)
        drafts: list[list[int]] = []
        for i, (sampled, req) in enumerate(zip(sampled_token_ids, found)):
            if not len(sampled):
                drafts.append([])
                continue
            n, row = int(num_tokens_no_spec[i]), token_ids_cpu[i]
            if req is None:
                req = self._new(row, n, len(sampled))
            else:
                self._extend(req, row, n)
            self.live[i] = req
            depth = min(self.k, self.max_model_len - n)  # no draft reaches past the model's length
            drafts.append(self.draft(req, depth) if depth > 0 else [])
        return drafts


class _VllmProposer:
    """vLLM's ``custom_class`` contract: built as ``Class(vllm_config)``; ``load_model(target)``
    (the CPU runner calls it; there is no model to load); ``propose(sampled_token_ids,
    num_tokens_no_spec, token_ids_cpu, slot_mappings=None)`` -> one draft list per row."""

    drafter = "hybrid"

    def __init__(self, vllm_config: "VllmConfig", cfg: Optional[VllmDrafterConfig] = None):
        spec = vllm_config.speculative_config
        if spec is None or not spec.num_speculative_tokens:
            raise ValueError("speculative_config needs num_speculative_tokens (the longest chain sent per step)")
        self.drafter_impl = TokenDrafter(cfg or VllmDrafterConfig(drafter=self.drafter),
                                         num_speculative_tokens=int(spec.num_speculative_tokens),
                                         max_model_len=int(vllm_config.model_config.max_model_len))

    def load_model(self, *args, **kwargs) -> None:
        """Nothing to load: the drafts come from the tokens."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        return self.drafter_impl.propose_rows(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)

    @property
    def stats(self) -> dict:
        return self.drafter_impl.stats


class MixProposer(_VllmProposer):
    """Every context length of the request's own text and of the shared store, mixed by learned
    reliability, matched again at each token of the chain (decoding/context_mix.py)."""

    drafter = "mix"


class HybridProposer(_VllmProposer):
    """The request's own suffix continuations, prompt lookup and the shared suffix store."""

    drafter = "hybrid"


class PromptLookupProposer(_VllmProposer):
    """Prompt lookup (our ``pld``)."""

    drafter = "pld"


class SuffixProposer(_VllmProposer):
    """The request's suffix trie and the store shared by the engine's requests (our ``suffix``)."""

    drafter = "suffix"


PROPOSERS = {"pld": PromptLookupProposer, "suffix": SuffixProposer, "hybrid": HybridProposer, "mix": MixProposer}


def vllm_model_folder(model: Optional[str] = None, cache_dir: Optional[Path] = None) -> Path:
    """The fp32 safetensors folder vLLM loads for one of our models: a Hugging Face folder as it
    is; a GGUF file (the default model is one) dequantised by transformers and saved once under
    ``cache_dir/vllm/<name>-<content digest>`` (default ~/.cache/specdec), reused after. Named by
    the file's content (``models.loader.content_key``), not its name: two files of one name are
    two models, and one file installed in many places (each clone's .venv) is one folder."""
    import os
    import shutil

    from models.loader import DEFAULT_CACHE_DIR, content_key, resolve_model_path

    path = resolve_model_path(model)
    if path.is_dir():
        return path
    cache = Path(cache_dir or DEFAULT_CACHE_DIR)
    name, remember = content_key(path, cache)
    out = cache / "vllm" / name
    if not _whole_folder(out):
        tmp = out.with_name(f"{out.name}.partial-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        _dequantised_folder(path, tmp)
        try:
            tmp.replace(out)  # whole or not at all: an interrupted conversion is not mistaken for a done one
        except OSError:  # another process made it first (or a damaged one stands there)
            if not _whole_folder(out):
                shutil.rmtree(out)
                tmp.replace(out)
        shutil.rmtree(tmp, ignore_errors=True)
        legacy = cache / "vllm" / path.stem  # an earlier version's folder, named by the file's name alone
        if (legacy / "config.json").is_file():
            shutil.rmtree(legacy, ignore_errors=True)
    remember()
    return out


def _whole_folder(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def _dequantised_folder(path: Path, out: Path) -> None:
    """GGUF file ``path`` dequantised to fp32 by transformers and saved with its tokenizer in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    # the weights are dequantised fp32 tensors now: drop the GGUF marks, or transformers refuses to
    # save a "quantized" model (and vLLM would look for GGUF weights)
    hf.hf_quantizer = None
    if hasattr(hf.config, "quantization_config"):
        del hf.config.quantization_config
    hf.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(out)
