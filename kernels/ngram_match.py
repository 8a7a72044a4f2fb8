"""Batched n-gram matching over ragged token histories (prompt lookup / tree drafts)."""

import array

import torch
import triton
import triton.language as tl


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


def ngram_match_lists(
    histories: list[list[int]],
    *,
    min_n: int,
    max_n: int,
    k: int,
    num_candidates: int = 1,
    prefer: str = "first",
    partial: bool = True,
) -> list[list[list[int]]]:
    """``ngram_match_ref``'s result for histories held as Python lists on the host: per
    history, its found continuations in order (no padding, no empty rows). The same search,
    but each n-gram is found by a byte search over the history packed as int64 (a C loop)
    instead of a Python loop over every position (more than ten times faster on a long history
    without a match). What the torch backend runs on the host (its reference would pack the
    lists into tensors and unpack them again)."""
    _check_ngram_args(min_n, max_n, k, num_candidates, prefer)
    out = []
    for h in histories:
        L = len(h)
        found: list[tuple[int, ...]] = []
        top = min(max_n, L - 1)
        if top >= min_n:
            buf = array.array("q", h).tobytes()
            stop = (L - 1) * 8  # a window h[i:i + n] with i <= L - n - 1 ends by then
            for n in range(top, min_n - 1, -1):
                pat = buf[(L - n) * 8:]
                hi = stop  # "recent": search below this byte offset next
                pos = -1
                while len(found) < num_candidates:
                    if prefer == "first":
                        pos = buf.find(pat, pos + 1, stop)
                    else:
                        pos = buf.rfind(pat, 0, hi)
                        hi = pos + len(pat) - 1
                    if pos < 0:
                        break
                    if pos % 8:  # straddles two tokens: not a match
                        continue
                    i = pos // 8
                    start, end = i + n, i + n + k
                    if partial:
                        end = min(end, L)  # start < L holds: i <= L - n - 1
                    elif end > L or start >= L - n:
                        continue
                    cont = tuple(h[start:end])
                    if cont not in found:
                        found.append(cont)
                if len(found) == num_candidates:
                    break
        out.append([list(c) for c in found])
    return out


# --------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------
# One program per sequence walks the same search order as the reference, BLOCK windows at a
# time: for n = max_n .. min_n, window starts i in the preferred order. Within a block the
# matching windows are taken in order; each one taken drops every window of the block with the
# same continuation, so a block costs at most 2 * NUM_CAND picks however repetitive the text.
# The walk stops as soon as NUM_CAND distinct continuations are found.


@triton.jit
def _ngram_match_kernel(
    tokens_ptr,  # (N_total,) int32/int64: histories back to back
    cu_seqlens_ptr,  # (B + 1,) int32
    cands_ptr,  # (B, NUM_CAND, k) dtype of tokens, pre-filled with -1
    lens_ptr,  # (B, NUM_CAND) int32, pre-filled with 0
    min_n, max_n, k,
    NUM_CAND: tl.constexpr,
    NC_PAD: tl.constexpr,  # NUM_CAND padded to a power of two
    PREFER_RECENT: tl.constexpr,
    PARTIAL: tl.constexpr,
    BLOCK: tl.constexpr,  # window starts examined at once
    BLOCK_K: tl.constexpr,  # k padded to a power of two
):
    b = tl.program_id(0)
    start = tl.load(cu_seqlens_ptr + b)
    L = tl.load(cu_seqlens_ptr + b + 1) - start
    hist = tokens_ptr + start.to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    slot = tl.arange(0, NC_PAD)
    found_start = tl.zeros((NC_PAD,), dtype=tl.int32)  # continuation start of each candidate found
    found_len = tl.zeros((NC_PAD,), dtype=tl.int32)
    found = tl.zeros((), dtype=tl.int32)
    n = tl.minimum(max_n, L - 1)  # an n-gram needs at least one earlier window: n <= L - 1
    while (n >= min_n) & (found < NUM_CAND):
        # Window starts i < n_valid can give a candidate (the tail's own window is i = L - n).
        if PARTIAL:
            n_valid = L - n
        else:
            # Seed rule: the continuation fits (i + n + k <= L) and is not the tail (i + n < L - n).
            n_valid = tl.maximum(tl.minimum(L - 2 * n, L - n - k + 1), 0)
        o0 = 0
        while (o0 < n_valid) & (found < NUM_CAND):
            o = o0 + tl.arange(0, BLOCK)  # rank in the search order
            if PREFER_RECENT:
                i = n_valid - 1 - o
            else:
                i = o
            hit = o < n_valid
            for j in range(0, n):
                want = tl.load(hist + L - n + j)
                hit = hit & (tl.load(hist + i + j, mask=hit, other=0) == want)
            cont_len = tl.minimum(k, L - (i + n))  # (BLOCK,) partial continuations stop at L
            while (found < NUM_CAND) & (tl.max(hit.to(tl.int32), 0) > 0):
                p_rank = tl.min(tl.where(hit, o, 2147483647), 0)
                if PREFER_RECENT:
                    p = n_valid - 1 - p_rank
                else:
                    p = p_rank
                p_start = p + n
                p_len = tl.minimum(k, L - p_start)
                in_p = offs_k < p_len
                cont = tl.load(hist + p_start + offs_k, mask=in_p, other=0)  # (BLOCK_K,)
                dup = tl.zeros((), dtype=tl.int1)
                for c in tl.static_range(NUM_CAND):
                    c_start = tl.sum(tl.where(slot == c, found_start, 0), 0)
                    c_len = tl.sum(tl.where(slot == c, found_len, 0), 0)
                    seen = (c < found) & (c_len == p_len)
                    # c_start is 0 for a slot not filled yet: still a valid address to read.
                    other = tl.load(hist + c_start + offs_k, mask=in_p, other=0)
                    dup = dup | (seen & (tl.sum((in_p & (other != cont)).to(tl.int32), 0) == 0))
                new = dup == 0
                # Scalar conditions enter vector masks through the limits (offs_k < 0 is all
                # false): the CPU interpreter mistypes `vector_bool & scalar_bool`.
                out_row = b.to(tl.int64) * NUM_CAND + found
                tl.store(cands_ptr + out_row * k + offs_k, cont, mask=offs_k < tl.where(new, p_len, 0))
                tl.store(lens_ptr + out_row, p_len, mask=new)
                fill = slot == tl.where(new, found, -1)
                found_start = tl.where(fill, p_start, found_start)
                found_len = tl.where(fill, p_len, found_len)
                found += new.to(tl.int32)
                # Drop every window of the block whose continuation equals this one (p included).
                tile = tl.load(hist + (i + n)[:, None] + offs_k[None, :],
                               mask=hit[:, None] & in_p[None, :], other=0)  # (BLOCK, BLOCK_K)
                differs = tl.sum((in_p[None, :] & (tile != cont[None, :])).to(tl.int32), 1)
                hit = hit & ((cont_len != p_len) | (differs > 0))
            o0 += BLOCK
        n -= 1


def ngram_match(
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
    """Triton version of ``ngram_match_ref`` (same arguments, same result). Grid: (B,); loop
    bounds come from cu_seqlens on the device, so there is no host round trip per sequence."""
    _check_ngram_args(min_n, max_n, k, num_candidates, prefer)
    if not isinstance(tokens, torch.Tensor) or tokens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"tokens must be an int32 or int64 tensor, got {getattr(tokens, 'dtype', tokens)}")
    if tokens.dim() != 1 or not tokens.is_contiguous():
        raise ValueError(f"tokens must be a contiguous 1-D tensor, got shape {tuple(tokens.shape)}")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype != torch.int32:
        raise ValueError(f"cu_seqlens must be an int32 tensor, got {getattr(cu_seqlens, 'dtype', cu_seqlens)}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1 or not cu_seqlens.is_contiguous():
        raise ValueError(f"cu_seqlens must be a contiguous 1-D tensor of B + 1 >= 1 offsets, "
                         f"got {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != tokens.device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but tokens is on {tokens.device}")
    if k > 1024:
        raise ValueError(f"k (continuation length) must be <= 1024, got {k}")
    if num_candidates > 64:
        raise ValueError(f"num_candidates must be <= 64, got {num_candidates}")
    B = cu_seqlens.numel() - 1
    cands = torch.full((B, num_candidates, k), -1, dtype=tokens.dtype, device=tokens.device)
    lens = torch.zeros(B, num_candidates, dtype=torch.int32, device=tokens.device)
    if B == 0:
        return cands, lens
    _ngram_match_kernel[(B,)](
        tokens, cu_seqlens, cands, lens,
        min_n, max_n, k,
        NUM_CAND=num_candidates, NC_PAD=triton.next_power_of_2(num_candidates),
        PREFER_RECENT=prefer == "recent", PARTIAL=bool(partial),
        BLOCK=256, BLOCK_K=triton.next_power_of_2(k),
    )
    return cands, lens
