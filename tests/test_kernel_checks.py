"""The Triton launchers refuse index values that would send a kernel outside the cache, naming
the argument and its limit (kernels/checks.py): always on a CPU, on a GPU under
SPECDEC_CHECK_VALUES=1 (reading the values back costs a host synchronisation there)."""

import pytest
import torch

from kernels import checks
from kernels.kv_ops import kv_compact, kv_store
from kernels.tree_attention import tree_attention

NB, BS, KV, D = 6, 4, 2, 8  # cache: 6 blocks of 4 slots


@pytest.fixture(autouse=True)
def _checked(monkeypatch):
    monkeypatch.setenv(checks.ENV, "1")  # where the tests run on a GPU (conftest), the checks too


def _cache():
    dev = torch.empty(0).device
    return torch.zeros(NB, BS, KV, D, device=dev), torch.zeros(NB, BS, KV, D, device=dev), dev


def _i32(x, dev):
    return torch.tensor(x, dtype=torch.int32, device=dev)


def test_kv_store_refuses_a_slot_outside_the_cache():
    kc, vc, dev = _cache()
    k = torch.ones(3, KV, D, device=dev)
    kv_store(kc, vc, k, k, torch.tensor([0, -1, NB * BS - 1], device=dev))  # -1 skips; the last slot is fine
    for bad in ([0, 1, NB * BS], [0, -2, 3]):
        with pytest.raises(ValueError, match=r"slot_mapping values must lie in \[-1, 24\)"):
            kv_store(kc, vc, k, k, torch.tensor(bad, device=dev))


def test_kv_compact_refuses_bad_accepted_rows_and_tables():
    kc, vc, dev = _cache()
    ok = dict(block_tables=_i32([[0, 1, -1]], dev), context_lens=_i32([2], dev), accept_idx=_i32([[0, 2, -1]], dev),
              accept_counts=_i32([2], dev))
    kv_compact(kc, vc, *ok.values())

    def call(**kw):
        kv_compact(kc, vc, *{**ok, **kw}.values())
    with pytest.raises(ValueError, match=r"accept_idx row 0: .* increasing"):
        call(accept_idx=_i32([[2, 0, -1]], dev))
    with pytest.raises(ValueError, match=r"accept_counts values must lie in \[0, 4\)"):
        call(accept_counts=_i32([4], dev))
    with pytest.raises(ValueError, match=r"block_tables values must lie in \[-1, 6\)"):
        call(block_tables=_i32([[0, 7, -1]], dev))
    with pytest.raises(ValueError, match=r"block_tables row 0: its sequence's first 2 blocks must be real"):
        call(block_tables=_i32([[0, -1, -1]], dev), accept_idx=_i32([[0, 5, -1]], dev))


def test_tree_attention_refuses_bad_offsets_and_tables():
    kc, vc, dev = _cache()
    q = torch.ones(3, KV, D, device=dev)
    ok = dict(cu=_i32([0, 1, 3], dev), pos=_i32([4, 2, 3], dev), tables=_i32([[0, 1], [2, -1]], dev),
              ctx=_i32([4, 2], dev))
    tree_attention(q, kc, vc, *ok.values())

    def call(**kw):
        tree_attention(q, kc, vc, *{**ok, **kw}.values())
    with pytest.raises(ValueError, match="cu_seqlens_q must start at 0, never decrease"):
        call(cu=_i32([0, 2, 1], dev))
    with pytest.raises(ValueError, match="end at most at T_total = 3"):
        call(cu=_i32([0, 1, 4], dev))
    with pytest.raises(ValueError, match=r"context_lens values must lie in \[0,"):
        call(ctx=_i32([-1, 2], dev))
    with pytest.raises(ValueError, match=r"block_tables row 1: its sequence's first 2 blocks must be real"):
        call(ctx=_i32([4, 3], dev))  # 3 + 2 step tokens need 2 blocks; the row has one
    with pytest.raises(ValueError, match="block_tables row 0 has 2 columns, its sequence needs 3 blocks"):
        call(ctx=_i32([8, 2], dev))


def test_on_a_gpu_the_checks_need_the_variable(monkeypatch):
    x = torch.zeros(1)
    assert checks.wanted(x)  # a CPU tensor: always checked
    cuda_like = type("T", (), {"device": torch.device("cuda")})()
    monkeypatch.setenv(checks.ENV, "0")
    assert not checks.wanted(cuda_like)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setenv(checks.ENV, "1")
    assert checks.wanted(cuda_like)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not checks.wanted(cuda_like)  # never inside a graph capture
