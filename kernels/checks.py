"""Value checks of the Triton launchers' index tensors: offsets, slots and block tables that
point outside the cache would make a kernel read or write out of bounds, silently.

Reading the values back costs a device synchronisation per launch on a GPU, so there the checks
run only when ``SPECDEC_CHECK_VALUES=1`` (for debugging) and never while a CUDA graph is being
captured. On a CPU (Triton's interpreter, the tests) there is nothing to synchronise and they
always run.
"""

import os

import torch

ENV = "SPECDEC_CHECK_VALUES"


def wanted(x: torch.Tensor) -> bool:
    if x.device.type != "cuda":
        return True
    return os.environ.get(ENV, "0") not in ("", "0") and not torch.cuda.is_current_stream_capturing()


def offsets(name: str, cu: torch.Tensor, total: int) -> list[int]:
    """``cu`` starts at 0, never decreases and ends at most at ``total`` (rows past its end belong
    to no sequence: a CUDA graph's padding); returns its values."""
    v = cu.tolist()
    if v and (v[0] != 0 or v[-1] > total or any(b < a for a, b in zip(v, v[1:]))):
        raise ValueError(f"{name} must start at 0, never decrease and end at most at T_total = {total}, got "
                         f"{v[:12]}" + (" ..." if len(v) > 12 else ""))
    return v


def in_range(name: str, x: torch.Tensor, lo: int, hi: int, what: str) -> None:
    """Every value of ``x`` in [lo, hi)."""
    if x.numel():
        mn, mx = int(x.min()), int(x.max())
        if mn < lo or mx >= hi:
            raise ValueError(f"{name} values must lie in [{lo}, {hi}) ({what}), got min {mn} and max {mx}")


def block_tables(name: str, tables: torch.Tensor, needed: list[int], num_blocks: int) -> None:
    """Row b's first ``needed[b]`` entries are blocks of the cache (the rest may be -1 padding)."""
    in_range(name, tables, -1, num_blocks, f"-1 pads, the cache has {num_blocks} blocks")
    width = tables.shape[1]
    rows = tables.tolist()
    for b, n in enumerate(needed):
        if n > width:
            raise ValueError(f"{name} row {b} has {width} columns, its sequence needs {n} blocks")
        if any(x < 0 for x in rows[b][:n]):
            raise ValueError(f"{name} row {b}: its sequence's first {n} blocks must be real blocks (>= 0), "
                             f"got {rows[b][:n]}")
