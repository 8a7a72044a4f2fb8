"""Every row's argmax and top-k of a step's logits, on any device: what the decoding loop and
the proposers reduce logits with (decoding/ depends on this, not on a CPU kernel module).

On an x86 CPU in fp32 one C pass per row (kernels/skinny.py, cpu/skinny_reduce.c: torch's
general reductions are several times slower on a step's few rows of a vocabulary); on other
devices and dtypes, for k above ``MAX_TOPK`` and for a row holding a NaN, torch's own
``argmax`` / ``topk``, which are also the references: the answers are the same either way
(equal values in index order)."""

import torch

from kernels import skinny

MAX_TOPK = skinny.MAX_TOPK


def argmax_rows(x: torch.Tensor) -> list[int]:
    """Per row of x (rows, n): the first index of its largest value, exactly
    ``x.argmax(-1).tolist()``."""
    if x.dim() != 2:
        raise ValueError(f"x must be (rows, n), got {tuple(x.shape)}")
    lib = skinny.rows_kernel(x)
    if lib is None:
        return x.argmax(-1).tolist()
    res = skinny.argmax_unchecked(lib, x)
    for r, i in enumerate(res):
        if i < 0:  # a NaN: torch's answer
            res[r] = int(x[r].argmax())
    return res


def argmax_topk_rows(x: torch.Tensor, k: int) -> tuple[list[int], list[list[int]]]:
    """``(argmax_rows(x), topk_rows(x, k))`` from one pass over the rows (a proposer that learns
    from every row's top-k also verifies with its argmax): the top-k's first index is the
    argmax, equal values being in index order; a row holding a NaN gets torch's answers."""
    _check_k(x, k)
    lib = skinny.rows_kernel(x)
    if lib is None or k > MAX_TOPK:  # one read back of both (on a GPU each is a synchronisation)
        both = torch.cat([x.argmax(-1, keepdim=True), x.topk(k, dim=-1).indices], dim=-1).tolist()
        return [row[0] for row in both], [row[1:] for row in both]
    res, bad = skinny.topk_unchecked(lib, x, k)
    top1 = [row[0] for row in res]
    for r in bad:
        res[r], top1[r] = x[r].topk(k).indices.tolist(), int(x[r].argmax())
    return top1, res


def topk_rows(x: torch.Tensor, k: int) -> list[list[int]]:
    """Per row of x (rows, n): the indices of its k largest values (1 <= k <= n), largest first,
    equal values in index order: ``x.topk(k, -1).indices.tolist()`` (torch leaves the order of
    equal values open)."""
    _check_k(x, k)
    lib = skinny.rows_kernel(x)
    if lib is None or k > MAX_TOPK:
        return x.topk(k, dim=-1).indices.tolist()
    res, bad = skinny.topk_unchecked(lib, x, k)
    for r in bad:
        res[r] = x[r].topk(k).indices.tolist()
    return res


def _check_k(x: torch.Tensor, k: int) -> None:
    if x.dim() != 2 or not 1 <= k <= x.shape[-1]:
        raise ValueError(f"x must be (rows, n) and 1 <= k <= n, got x {tuple(x.shape)} and k={k}")
