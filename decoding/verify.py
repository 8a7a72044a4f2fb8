"""Deciding what a step accepts.

* greedy: the longest path whose every token is the argmax of its parent's logits, plus the
  argmax after the last accepted node (the bonus token): identical to plain greedy decoding.
* one-hot drafts, sampling: recursive rejection over each node's candidate children. With
  the target distribution p at a node, child x is accepted with probability p(x); on
  rejection p(x) is set to 0 and p renormalised; when every child is rejected the bonus is
  drawn from what remains. The emitted token at every node is then distributed exactly as p.
* a draft model's proposals (chain with draft distributions q): accept x with probability
  min(1, p(x) / q(x)); on rejection draw from normalise(max(p - q, 0)) (Leviathan et al. 2023).
"""

from typing import Optional

import torch

from decoding.sampling import SamplingParams, probs_from_logits, sample
from decoding.tree import DRAFT, StepTree
from kernels.rows import argmax_rows
from models.runner import logits_tensor


def _uniform(generator: Optional[torch.Generator]) -> float:
    return float(torch.rand((), generator=generator, device=None if generator is None else generator.device))


def verify(tree: StepTree, logits: torch.Tensor, rows: dict[int, int], sampling: SamplingParams,
           generator: Optional[torch.Generator], top1: Optional[list[int]] = None) -> tuple[list[int], int]:
    """The one entry for one-hot drafts: ``logits`` (R, V) with ``rows[node]`` its row, for
    every candidate node that was sent; ``top1``: the argmax of every row when the caller has
    it (greedy). Returns (accepted path, root first; bonus token)."""
    if sampling.greedy:  # argmax of every row (no gathered copy of the rows), then picked
        return greedy_path(tree, rows, argmax_rows(logits_tensor(logits)) if top1 is None else top1)
    nodes = [n for n in rows if tree.candidate[n]]
    probs = probs_from_logits(logits_tensor(logits)[[rows[n] for n in nodes]], sampling)
    return verify_sampling(tree, dict(zip(nodes, probs)), generator)


def greedy_path(tree: StepTree, rows: dict[int, int], top1: list[int]) -> tuple[list[int], int]:
    """``verify_greedy`` along the path alone, from every row's argmax ``top1`` (``rows[node]``:
    the node's row): only the path's nodes are read (each a sent candidate, so a row). The loop
    calls it directly for a proposer that keeps the common ``verify`` (decode_step)."""
    children, node, path = tree.children, 0, [0]
    while (child := children[node].get(top1[rows[node]])) is not None:
        path.append(child)
        node = child
    return path, top1[rows[node]]


def verify_greedy(tree: StepTree, next_tokens: list[int]) -> tuple[list[int], int]:
    """``next_tokens[node]`` = argmax of that node's logits (for candidate nodes).
    Returns (accepted path of nodes starting with the root 0, bonus token)."""
    node, path = 0, [0]
    while True:
        child = tree.children[node].get(next_tokens[node])
        if child is None:
            return path, next_tokens[node]
        path.append(child)
        node = child


def verify_sampling(tree: StepTree, probs: dict[int, torch.Tensor],
                    generator: Optional[torch.Generator]) -> tuple[list[int], int]:
    """``probs[node]`` = (V,) target distribution after that node. One-hot drafts."""
    node, path = 0, [0]
    while True:
        p = probs[node]
        kids = tree.candidate_children(node)
        chosen = None
        if kids:
            p = p.clone()
            for child in kids:
                x = tree.tokens[child]
                total = float(p.sum())
                if total > 0 and _uniform(generator) < float(p[x]) / total:
                    chosen = child
                    break
                p[x] = 0.0
        if chosen is None:
            total = p.sum()
            if total <= 0:  # every token with mass was a rejected child: cannot happen exactly
                p, total = probs[node], probs[node].sum()
            return path, sample(p / total, generator)
        path.append(chosen)
        node = chosen


def verify_draft_model(chain_tokens: list[int], p: torch.Tensor, q: torch.Tensor,
                       generator: Optional[torch.Generator]) -> tuple[int, int]:
    """Speculative sampling over a draft model's chain.
    p: (k + 1, V) target distributions (row i = after i chain tokens), q: (k, V) draft ones.
    Returns (number of accepted chain tokens, next token)."""
    for i, x in enumerate(chain_tokens):
        px, qx = float(p[i, x]), float(q[i, x])
        if qx > 0 and _uniform(generator) < min(1.0, px / qx):
            continue
        residual = (p[i] - q[i]).clamp_min(0)
        total = residual.sum()
        if total <= 0:  # p == q exactly at this node: the draw from p itself is exact
            residual, total = p[i], p[i].sum()
        return i, sample(residual / total, generator)
    return len(chain_tokens), sample(p[len(chain_tokens)], generator)


def verify_mixed(tree: StepTree, probs: dict[int, torch.Tensor], q: Optional[torch.Tensor],
                 generator: Optional[torch.Generator]) -> tuple[list[int], int]:
    """Sampling over a trie whose children carry their own proposals: the child drafted by a
    draft model (source DRAFT; at depth d it was drawn from ``q[d - 1]``) and one-hot children
    (prompt lookup and the like). At each node, recursive rejection: the draft child first,
    accepted with min(1, p(x) / q(x)), else p <- max(p - q, 0); then each one-hot child x,
    accepted with p(x), else p(x) <- 0; each time renormalised; the bonus token from what is
    left. Every step keeps the target distribution, whatever the proposals (a one-hot child
    equal to the draft child is merged into it: after a rejection the residual gives it no
    mass, so nothing is lost)."""
    node, path = 0, [0]
    while True:
        p = probs[node].clone()
        kids = sorted(tree.candidate_children(node), key=lambda c: not tree.sources[c] & DRAFT)
        chosen = None
        for child in kids:
            x, total = tree.tokens[child], float(p.sum())
            if total <= 0:
                break
            if tree.sources[child] & DRAFT:
                qd = q[tree.depths[child] - 1]
                qx = float(qd[x])
                if qx > 0 and _uniform(generator) < min(1.0, float(p[x]) / total / qx):
                    chosen = child
                    break
                p = (p / total - qd).clamp_min(0)
            else:
                if _uniform(generator) < float(p[x]) / total:
                    chosen = child
                    break
                p[x] = 0.0
        if chosen is None:
            total = p.sum()
            if total <= 0:  # p == q exactly, or every token with mass was rejected: draw from p itself
                p, total = probs[node], probs[node].sum()
            return path, sample(p / total, generator)
        path.append(chosen)
        node = chosen
