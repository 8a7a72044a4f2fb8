"""Batched n-gram matching over ragged token histories (prompt lookup / tree drafts)."""

import torch


def _check_ngram_args(min_n: int, max_n: int, k: int, num_candidates: int, prefer: str) -> None:
    if min_n < 1:
        raise ValueError(f"min_n must be >= 1, got {min_n}")
    if max_n < min_n:
        raise ValueError(f"max_n must be >= min_n ({min_n}), got {max_n}")
    if k < 1:
        raise ValueError(f"k (continuation length) must be >= 1, got {k}")
    if num_candidates < 1:
        raise ValueError(f"num_candidates must be >= 1, got {num_candidates}")
    if prefer not in ("first", "recent"):
        raise ValueError(f"prefer must be 'first' or 'recent', got {prefer!r}")


def ngram_match_ref(
    tokens: torch.Tensor,  # (N_total,) int32/int64: histories back to back
    cu_seqlens: torch.Tensor,  # (B + 1,) int32
    *,
    min_n: int,
    max_n: int,
    k: int,
    num_candidates: int = 1,
    prefer: str = "first",
    partial: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, num_candidates, k) dtype of tokens (-1 pad), (B, num_candidates) int32
    """For each history h of length L, for n = max_n .. min_n, look at every earlier window
    h[i : i + n] equal to the last n tokens h[L - n : L], in order of i ("first": increasing,
    "recent": decreasing), and take its continuation h[i + n : i + n + k] if valid:
      * partial=True : the continuation is non-empty (i + n < L) and is cut at the history end;
      * partial=False: the seed rule -- i + n + k <= L and i + n < L - n (no self match).
    Candidates are collected until ``num_candidates`` distinct continuations (as token tuples)
    are found, moving to smaller n when a size is exhausted. With num_candidates=1,
    prefer="first", partial=False this is exactly the prompt-lookup seed's function.
    """
    _check_ngram_args(min_n, max_n, k, num_candidates, prefer)
    B = cu_seqlens.numel() - 1
    out = torch.full((B, num_candidates, k), -1, dtype=tokens.dtype, device=tokens.device)
    lens = torch.zeros(B, num_candidates, dtype=torch.int32, device=tokens.device)
    cu = cu_seqlens.tolist()
    for b in range(B):
        h = tokens[cu[b]:cu[b + 1]].tolist()
        L = len(h)
        found: list[tuple[int, ...]] = []
        for n in range(min(max_n, L - 1), min_n - 1, -1):
            tail = h[L - n:]
            order = range(L - n) if prefer == "first" else range(L - n - 1, -1, -1)
            for i in order:
                if h[i:i + n] != tail:
                    continue
                start, end = i + n, i + n + k
                if partial:
                    ok = start < L
                    end = min(end, L)
                else:
                    ok = end <= L and start < L - n
                if not ok:
                    continue
                cont = tuple(h[start:end])
                if cont not in found:
                    found.append(cont)
                    if len(found) == num_candidates:
                        break
            if len(found) == num_candidates:
                break
        for c, cont in enumerate(found):
            out[b, c, :len(cont)] = torch.tensor(cont, dtype=tokens.dtype)
            lens[b, c] = len(cont)
    return out, lens
