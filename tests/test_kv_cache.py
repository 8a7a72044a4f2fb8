"""Paged KV cache bookkeeping; pool exhaustion leaves every other sequence intact."""

import random

import pytest
import torch

from helpers import ours_from_hf, tiny_hf_model
from models.config import ModelConfig
from models.kv_cache import KVCacheFull, PagedKVCache
from kernels import cbuild
from kernels.mask import pack_mask
from models import packing
from models.runner import ModelRunner, StepInput

CFG = ModelConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_layers=2, num_heads=2, num_kv_heads=1)


def test_reserve_commit_truncate_free():
    c = PagedKVCache(CFG, num_blocks=6, block_size=4)
    c.add(0)
    c.add(1)
    c.reserve({0: 5, 1: 3})
    assert len(c.blocks[0]) == 2 and len(c.blocks[1]) == 1 and len(c.free_blocks) == 3
    c.commit(0, 5)
    assert c.lengths[0] == 5
    assert c.slots(0, 3, 3) == [c.blocks[0][0] * 4 + 3, c.blocks[0][1] * 4, c.blocks[0][1] * 4 + 1]
    c.truncate(0, 2)
    assert c.lengths[0] == 2 and len(c.blocks[0]) == 1 and len(c.free_blocks) == 4
    table = c.block_table([0, 1])
    assert table.dtype == torch.int32 and table.shape == (2, 1)
    c.free(0)
    assert len(c.free_blocks) == 5 and 0 not in c.blocks
    with pytest.raises(ValueError, match="commit"):
        c.commit(1, 5)  # more than reserved
    with pytest.raises(ValueError, match="truncate"):
        c.truncate(1, 1)  # longer than committed (0)
    with pytest.raises(ValueError, match="already"):
        c.add(1)
    with pytest.raises(ValueError, match="num_blocks"):
        PagedKVCache(CFG, num_blocks=0)


def test_exhaustion_is_all_or_nothing():
    c = PagedKVCache(CFG, num_blocks=3, block_size=4)
    for s in (0, 1):
        c.add(s)
    c.reserve({0: 4})
    before = ({s: list(b) for s, b in c.blocks.items()}, list(c.free_blocks))
    with pytest.raises(KVCacheFull, match="2 of 3 are free"):
        c.reserve({0: 8, 1: 8})  # needs 1 + 2 blocks, 2 free
    assert ({s: list(b) for s, b in c.blocks.items()}, list(c.free_blocks)) == before


def test_rejected_step_leaves_other_sequences_intact():
    hf = tiny_hf_model("llama")
    runner = ours_from_hf(hf, cache_tokens=48, block_size=4)  # 12 blocks
    seqs = {0: list(range(1, 14)), 1: list(range(20, 29))}
    for s, ids in seqs.items():
        runner.add_sequence(s)
        runner.step([StepInput(s, ids)])
        runner.commit({s: list(range(len(ids)))})
    k_before = runner.cache.k.clone()
    blocks_before = {s: list(b) for s, b in runner.cache.blocks.items()}
    with pytest.raises(KVCacheFull):
        runner.step([StepInput(1, [5]), StepInput(0, list(range(40, 80)))])  # 0 wants 40 more slots
    assert torch.equal(runner.cache.k, k_before)
    assert {s: list(b) for s, b in runner.cache.blocks.items()} == blocks_before
    # both sequences continue exactly as if nothing happened
    out = runner.step([StepInput(0, [7]), StepInput(1, [8])])
    for (s, ids), o, t in zip(seqs.items(), out, (7, 8)):
        with torch.no_grad():
            ref = hf(torch.tensor([ids + [t]])).logits[0, -1]
        assert (o[0] - ref).abs().max() < 1e-4


def test_step_rejects_bad_input_without_side_effects():
    hf = tiny_hf_model("llama")
    runner = ours_from_hf(hf, cache_tokens=64, block_size=4)
    runner.add_sequence(0)
    free_before = list(runner.cache.free_blocks)
    with pytest.raises(ValueError, match="at least one token"):
        runner.step([StepInput(0, [])])
    with pytest.raises(ValueError, match="token ids"):
        runner.step([StepInput(0, [1, 500])])
    with pytest.raises(ValueError, match="context"):
        runner.step([StepInput(0, [1, 2], depths=[0, 300])])  # max_position_embeddings = 256
    with pytest.raises(ValueError, match="mask"):
        runner.step([StepInput(0, [1, 2], mask=torch.ones(3, 3, dtype=torch.bool))])
    for bad in ([-1, 0], [0, -1, 0], [-1, 1, 0], [-1, 0, 2]):  # wrong length / root / a parent not before its row
        with pytest.raises(ValueError, match="parents"):
            runner.step([StepInput(0, [1, 2, 3], parents=bad)])
    with pytest.raises(ValueError, match="mask or parents"):
        runner.step([StepInput(0, [1, 2], mask=torch.ones(2, 2, dtype=torch.bool).tril(), parents=[-1, 0])])
    with pytest.raises(KeyError, match="sequence 9 is not in the cache"):
        runner.step([StepInput(9, [1])])
    with pytest.raises(KeyError, match="sequence 9 is not in the cache"):  # after a known one, greedy too
        runner.step_greedy([StepInput(0, [1]), StepInput(9, [1])])
    with pytest.raises(ValueError, match="only once"):
        runner.step([StepInput(0, [1]), StepInput(0, [2])])
    assert runner.cache.free_blocks == free_before and runner.cache.lengths[0] == 0


def test_a_step_given_by_parents_is_the_step_given_by_its_mask():
    """The runner packs a tree's mask from its parents without building it: the same logits as
    the (T, T) mask, in a ragged batch with a causal sequence beside it, over 40 rows (two
    mask words)."""
    from decoding.tree import PLD, StepTree
    hf = tiny_hf_model("llama")
    g = torch.Generator().manual_seed(0)
    tree = StepTree.root(3)
    while len(tree) < 40:
        parent = int(torch.randint(0, len(tree), (1,), generator=g))
        tree.add_child(parent, int(torch.randint(1, 90, (1,), generator=g)), PLD)
    outs = []
    for how in ("mask", "parents"):
        runner = ours_from_hf(hf, cache_tokens=256, block_size=4)
        for s, ids in ((0, list(range(1, 14))), (1, list(range(20, 29)))):
            runner.add_sequence(s)
            runner.step([StepInput(s, ids)])
            runner.commit({s: list(range(len(ids)))})
        step = StepInput(0, tree.tokens, tree.depths, **({"mask": tree.mask()} if how == "mask" else
                                                         {"parents": tree.parents}))
        outs.append(torch.cat(runner.step([StepInput(1, [5, 6, 7]), step])))
    assert torch.equal(outs[0], outs[1])


def test_warm_up_commit_moves_kv_on_a_scratch_sequence_and_frees_it(monkeypatch):
    """The bench's warm-up commit runs the compaction once and leaves the runner as it was."""
    runner = ours_from_hf(tiny_hf_model("llama"), cache_tokens=48, block_size=4)
    runner.add_sequence(0)
    free_before = len(runner.cache.free_blocks)
    backend, moved = runner.model.backend, []
    compact = backend.kv_compact
    monkeypatch.setattr(backend, "kv_compact", lambda *a: moved.append(a[-2].tolist()) or compact(*a))
    monkeypatch.setattr(packing, "compacts", lambda cache: False)  # the backend's kernel, not the host twin
    monkeypatch.setattr(packing, "commit", lambda cache, accepted: False)  # nor the twin's one-call commit
    runner.warm_up_commit()
    assert moved == [[[0, 2]]]
    assert runner.seq_ids == [0] and len(runner.cache.free_blocks) == free_before


def _twin_commits(cache) -> bool:
    """Whether the cache's commits went through the extension (models.packing.commit made its K/V
    addresses)."""
    return cache.host_kv is not None and bool(cache.host_kv[2])


@pytest.mark.parametrize("seed", range(4))
def test_compiled_compaction_moves_the_rows_the_reference_moves(seed):
    """models/packing.py's commit in one call of the extension (packext.c commit_host) and its
    compaction glued in Python (one C call over every layer) against the backend's reference
    (kernels.kv_ops.kv_compact_ref): the same caches and lengths bit for bit after random steps
    of several sequences accepting random increasing rows."""
    caches = []
    for on, glue in ((True, True), (True, False), (False, False)):
        before, glue_before = cbuild.set_host_compiled(on), cbuild.set_host_glue(glue)
        try:
            runner = ours_from_hf(tiny_hf_model("llama"), cache_tokens=256, block_size=4, shuffle_seed=seed)
            g = torch.Generator().manual_seed(seed)
            runner.cache.k.copy_(torch.randn(runner.cache.k.shape, generator=g))
            runner.cache.v.copy_(torch.randn(runner.cache.v.shape, generator=g))
            r = random.Random(seed)
            for s in range(3):
                runner.add_sequence(s)
            for _ in range(6):
                steps = {s: r.randrange(1, 12) for s in range(3)}
                runner.cache.reserve(steps)
                runner.commit({s: sorted(r.sample(range(T), r.randrange(0, T + 1))) for s, T in steps.items()})
            assert packing.compacts(runner.cache) == (on and packing.LIBRARY.get() is not None)
            assert _twin_commits(runner.cache) == (on and glue and packing.EXT.get() is not None)
            caches.append((runner.cache.k.clone(), runner.cache.v.clone(), dict(runner.cache.lengths)))
        finally:
            cbuild.set_host_compiled(before)
            cbuild.set_host_glue(glue_before)
    for other in caches[1:]:
        assert torch.equal(caches[0][0], other[0]) and torch.equal(caches[0][1], other[1])
        assert caches[0][2] == other[2]


@pytest.mark.parametrize("on", [True, False], ids=["compiled", "reference"])
def test_a_refused_commit_names_what_is_wrong_and_changes_nothing(on):
    """Accepted rows that are not increasing, negative, past the step's room, or of a sequence the
    cache does not hold: the commit raises (the extension leaves each to the Python, which names
    it) and no length and no K/V row changes, the other sequences' included."""
    before, glue_before = cbuild.set_host_compiled(on), cbuild.set_host_glue(on)
    try:
        runner = ours_from_hf(tiny_hf_model("llama"), cache_tokens=64, block_size=4)
        g = torch.Generator().manual_seed(1)
        runner.cache.k.copy_(torch.randn(runner.cache.k.shape, generator=g))
        runner.cache.v.copy_(torch.randn(runner.cache.v.shape, generator=g))
        for s in (0, 1):
            runner.add_sequence(s)
        runner.cache.reserve({0: 6, 1: 3})
        runner.commit({0: [0, 2, 5], 1: [0, 1]})  # a valid step first: the twin's K/V addresses are made
        runner.cache.reserve({0: 5, 1: 3})
        k, v, lengths = runner.cache.k.clone(), runner.cache.v.clone(), dict(runner.cache.lengths)
        for bad, match in (({0: [0, 2], 1: [1, 1]}, "increasing"), ({0: [0, 3], 1: [-1, 0]}, "increasing"),
                           ({1: [0, 2], 0: [0, 9]}, "outside"), ({0: [0, 1], 7: [0]}, "7")):
            with pytest.raises((ValueError, KeyError), match=match):
                runner.commit(bad)
            assert runner.cache.lengths == lengths
            assert torch.equal(runner.cache.k, k) and torch.equal(runner.cache.v, v)
        runner.commit({1: [], 0: [0, 3]})  # the same runner still commits
        assert runner.cache.lengths == {0: lengths[0] + 2, 1: lengths[1]}
        assert _twin_commits(runner.cache) == (on and packing.EXT.get() is not None)
    finally:
        cbuild.set_host_compiled(before)
        cbuild.set_host_glue(glue_before)


def _padded_table(cache, seq_ids):
    """The step's block table: each sequence's blocks, then -1 up to the widest sequence's
    blocks rounded up to a power of two (models.packing.table_width)."""
    table = cache.block_table(seq_ids)
    width = 1
    while width < table.shape[1]:
        width *= 2
    return torch.cat([table, torch.full((len(seq_ids), width - table.shape[1]), -1, dtype=torch.int32)], dim=1)


def _prepare_ref(runner, inputs):
    """What ``ModelRunner.prepare`` must pack, written plainly: one tensor per field."""
    cache = runner.cache
    tokens, positions, slots, cu, idx = [], [], [], [0], []
    for inp in inputs:
        ctx, T = cache.lengths[inp.seq_id], len(inp.tokens)
        depths = list(range(T)) if inp.depths is None else inp.depths
        tokens += inp.tokens
        positions += [ctx + d for d in depths]
        slots += cache.slots(inp.seq_id, ctx, T)
        idx += [cu[-1] + r for r in (range(T) if inp.logits_rows is None else inp.logits_rows)]
        cu.append(cu[-1] + T)
    trees = [inp.mask is not None or inp.parents is not None for inp in inputs]
    mask = None
    if any(trees):
        words = -(-max(len(i.tokens) for i, t in zip(inputs, trees) if t) // 32)
        mask = torch.zeros(cu[-1], words, dtype=torch.int32)
        for b, inp in enumerate(inputs):
            if inp.parents is not None:
                m = torch.zeros(len(inp.parents), len(inp.parents), dtype=torch.bool)
                for i, p in enumerate(inp.parents):
                    if p >= 0:
                        m[i] = m[p]
                    m[i, i] = True
            else:
                m = inp.mask
            if m is not None:
                packed = pack_mask(m)
                mask[cu[b]:cu[b + 1], :packed.shape[1]] = packed
    seq_ids = [i.seq_id for i in inputs]
    return dict(tokens=torch.tensor(tokens), positions=torch.tensor(positions, dtype=torch.int32),
                slots=torch.tensor(slots), cu=torch.tensor(cu, dtype=torch.int32),
                lens=torch.tensor([cache.lengths[s] for s in seq_ids], dtype=torch.int32),
                table=_padded_table(cache, seq_ids), mask=mask,
                causal=None if mask is None else torch.tensor([not t for t in trees]),
                idx=None if len(idx) == cu[-1] else torch.tensor(idx), max_q=max(len(i.tokens) for i in inputs))


def test_steps_packed_in_two_threads_keep_their_own_buffers():
    """Each thread packs into its own buffers (models.packing.thread_staging): two threads
    stepping runners at once, each checking its step after the other had time to pack its own,
    see their own values."""
    import threading
    import time

    from models import packing
    if not packing.enabled():
        pytest.skip(f"the compiled packing did not build: {packing.LIBRARY.reason}")
    model = ours_from_hf(tiny_hf_model("llama"), cache_tokens=512, block_size=4).model
    errors, done = [], []

    def work(seed: int) -> None:
        try:
            runner = ModelRunner(model, cache_tokens=512, block_size=4)
            runner.add_sequence(0)
            runner.assume_context(0, 5 + seed)
            r = random.Random(seed)
            for _ in range(60):
                T = r.randrange(1, 12)
                step = [StepInput(0, [r.randrange(50) for _ in range(T)], parents=[-1] + [r.randrange(i) for i in
                                                                                          range(1, T)])]
                tokens, meta, idx = runner.prepare(step, reuse=True)
                time.sleep(0)  # the other thread packs now
                want = _prepare_ref(runner, step)
                if not (torch.equal(tokens, want["tokens"]) and torch.equal(meta.positions, want["positions"])
                        and torch.equal(meta.mask, want["mask"]) and torch.equal(meta.slot_mapping, want["slots"])):
                    errors.append(seed)
            done.append(seed)
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and sorted(done) == [1, 2]


@pytest.mark.parametrize("compiled,reuse", [(True, False), (True, True), (False, False)],
                         ids=["compiled", "compiled-reused", "reference"])
def test_prepare_packs_every_field_as_the_plain_reference(compiled, reuse, monkeypatch):
    """Both packings (models/packing.py's C twin and ModelRunner._prepare_ref) against a plain
    construction of every field; the C twin also writing again the buffers of an earlier step
    of the same layout (``reuse``: every step twice, in turn)."""
    from kernels import cbuild
    from models import packing

    monkeypatch.setattr(cbuild, "_host", {"compiled": compiled})
    assert packing.enabled() == (compiled and packing.LIBRARY.get() is not None)
    if compiled and not packing.enabled():
        pytest.skip(f"the compiled packing did not build: {packing.LIBRARY.reason}")
    runner = ours_from_hf(tiny_hf_model("llama"), cache_tokens=512, block_size=4)
    gen = torch.Generator().manual_seed(0)
    for s, n in ((0, 7), (1, 1), (2, 13), (3, 40)):
        runner.add_sequence(s)
        runner.assume_context(s, n)
    mask = torch.rand(5, 5, generator=gen) < 0.5
    mask |= torch.eye(5, dtype=torch.bool)
    steps = [
        [StepInput(0, [3])],  # one decoding token
        [StepInput(0, [3, 4, 5]), StepInput(2, [1])],  # chains: causal
        [StepInput(1, [1, 2, 3, 4], depths=[0, 1, 1, 2], parents=[-1, 0, 0, 1], logits_rows=[0, 2]),
         StepInput(3, list(range(1, 36)), depths=list(range(35)), parents=[-1] + list(range(34)))],  # 2 mask words
        [StepInput(2, [5] * 5, depths=[0, 1, 2, 1, 2], mask=mask), StepInput(0, [6, 7]),
         StepInput(3, [8], logits_rows=[])],  # an explicit mask beside causal rows
        [StepInput(0, [1, 2, 3], parents=[-1, 0, 0], logits_rows=[2, 0]), StepInput(2, [4, 5]),
         StepInput(1, [6], logits_rows=[0])],  # a tree beside a chain, rows out of order
        [StepInput(3, list(range(1, 70)), parents=[-1] + [i // 2 for i in range(68)])],  # 3 mask words
    ]
    for step in steps * (2 if reuse else 1):
        tokens, meta, idx = runner.prepare(step, reuse=reuse)
        ref = _prepare_ref(runner, step)
        if reuse and compiled and step is not steps[3]:  # written into the thread's buffers (not the explicit mask)
            staging = packing.thread_staging()
            assert tokens.untyped_storage().data_ptr() == staging.v64.untyped_storage().data_ptr()
            assert meta.positions.untyped_storage().data_ptr() == staging.v32.untyped_storage().data_ptr()
        assert torch.equal(tokens, ref["tokens"]) and torch.equal(meta.positions, ref["positions"])
        assert torch.equal(meta.slot_mapping, ref["slots"]) and torch.equal(meta.cu_seqlens_q, ref["cu"])
        assert torch.equal(meta.context_lens, ref["lens"]) and torch.equal(meta.block_tables, ref["table"])
        assert meta.max_seqlen_q == ref["max_q"]
        for got, want in ((meta.mask, ref["mask"]), (meta.causal, ref["causal"]), (idx, ref["idx"])):
            assert (got is None) == (want is None) and (got is None or torch.equal(got, want))
        for t in (tokens, meta.positions, meta.slot_mapping, meta.cu_seqlens_q, meta.context_lens, meta.block_tables,
                  meta.mask, idx):
            assert t is None or t.data_ptr() % 16 == 0  # each piece aligned as a tensor of its own
    # bad input: the reference's message, and nothing reserved
    free = len(runner.cache.free_blocks)
    for step, match in (([StepInput(0, [3, 99999])], "token ids"), ([StepInput(0, [3, 4], parents=[-1, 1])], "parents"),
                        ([StepInput(0, [3], depths=[-1])], "positions"), ([StepInput(0, [])], "at least one"),
                        ([StepInput(0, [1] * 40, depths=list(range(500, 540)))], "context")):
        with pytest.raises(ValueError, match=match):
            runner.prepare(step)
        assert len(runner.cache.free_blocks) == free


def _packed_fields(packed) -> list:
    tokens, meta, idx = packed
    return [None if t is None else t.clone() for t in (tokens, meta.positions, meta.slot_mapping, meta.cu_seqlens_q,
                                                       meta.context_lens, meta.block_tables, meta.mask, meta.causal,
                                                       idx)] + [meta.max_seqlen_q]


def _same(a: list, b: list) -> bool:
    return all((x is None) == (y is None) and (x is None or (torch.equal(x, y) if isinstance(x, torch.Tensor)
                                                               else x == y)) for x, y in zip(a, b))


def test_the_extension_glues_a_staged_step_as_the_python_glue(monkeypatch):
    """models/cpu/packext.c (a staged CPU step in one call) against the Python glue of the same
    library: the same tensors and the same cache lists after it (blocks reserved in the same
    order) over random ragged steps of trees, chains and logits rows, sequences growing past
    their blocks (a layout the staging has not met made through ``Staging.layout``); and where
    it must not take a step (an explicit mask, values that are not ints, a pool too short, input
    the checks refuse) the Python glue's result or error, with nothing reserved by it."""
    monkeypatch.setattr(cbuild, "_host", {"compiled": True})
    if not packing.enabled() or packing.EXT.get() is None:
        pytest.skip(f"the packing or its extension did not build: {packing.LIBRARY.reason or packing.EXT.reason}")
    model = ours_from_hf(tiny_hf_model("llama"), cache_tokens=1024, block_size=4).model
    runners = [ModelRunner(model, cache_tokens=1024, block_size=4) for _ in range(2)]
    for runner in runners:
        for s, n in ((0, 3), (1, 0), (2, 17), (5, 150)):
            runner.add_sequence(s)
            runner.assume_context(s, n)
    calls = {"ext": 0, "reserved": 0}
    real = packing.EXT.module.pack_staged

    def counted(*a):
        free = len(a[3])
        out = real(*a)
        calls["ext"] += out is not None
        calls["reserved"] += len(a[3]) < free
        return out

    monkeypatch.setattr(packing.EXT.module, "pack_staged", counted)
    r = random.Random(0)
    for i in range(200):
        # first narrow steps of a few shapes beside sequence 5 (38 blocks, never growing), which sets the table's
        # width: the others take new blocks in layouts met before; then steps of any shape, each packed twice
        wide = i >= 120 and i % 2 == 0
        step = [] if wide else [StepInput(5, [r.randrange(CFG.vocab_size)])]
        for s in (r.sample([0, 1, 2, 5], r.randrange(1, 5)) if wide else [r.choice((0, 1, 2))]):
            T = r.randrange(1, 40) if wide else 3
            tree = r.random() < 0.6
            parents = [-1] + [r.randrange(j) for j in range(1, T)] if tree else None
            depths = None
            if tree:
                depths = [0] * T
                for j in range(1, T):
                    depths[j] = depths[parents[j]] + 1
            rows = (None if r.random() < 0.3 else sorted(r.sample(range(T), r.randrange(0, T + 1)))) if wide else None
            inp = StepInput(s, [r.randrange(CFG.vocab_size) for _ in range(T)], depths=depths, parents=parents,
                            logits_rows=rows)
            step.append(inp)
        for _ in range(2 if wide else 1):
            outs = []
            for on, runner in zip((True, False), runners):
                before = cbuild.set_host_glue(on)
                try:
                    outs.append(_packed_fields(runner.prepare(step, reuse=True)))
                finally:
                    cbuild.set_host_glue(before)
            assert _same(*outs), i
            a, b = (x.cache for x in runners)
            assert a.blocks == b.blocks and a.free_blocks == b.free_blocks and a.lengths == b.lengths
        accepted = {inp.seq_id: list(range(r.randrange(1, 3))) if inp.seq_id != 5 else [] for inp in step}
        for runner in runners:
            runner.commit(accepted)
    # every step was the extension's (new layouts included), some of them taking new blocks
    assert calls["ext"] == 240 and calls["reserved"] >= 5, calls
    # what it leaves to the Python glue (each checked against the plain reference's message)
    runner = runners[0]
    runner.add_sequence(8)
    runner.add_sequence(9)  # holds all the pool's free blocks but one
    runner.cache.reserve({9: (len(runner.cache.free_blocks) - 1) * 4})
    free = list(runner.cache.free_blocks)
    mask = torch.ones(2, 2, dtype=torch.bool).tril()
    for step, match in (([StepInput(0, [3, 99999])], "token ids"), ([StepInput(0, [3, 4], parents=[-1, 1])], "parents"),
                        ([StepInput(0, [3.0])], "integer|int"),
                        ([StepInput(0, [1] * 40, depths=list(range(2000, 2040)))], "context"),
                        ([StepInput(8, [1] * 12)], "pool exhausted")):
        calls["ext"] = 0
        with pytest.raises((ValueError, TypeError), match=match):
            runner.prepare(step, reuse=True)
        assert calls["ext"] == 0 and runner.cache.free_blocks == free
    tokens, meta, _ = runner.prepare([StepInput(2, [1, 2], mask=mask)], reuse=True)
    assert meta.mask is not None and tokens.tolist() == [1, 2]


def test_without_python_headers_the_python_glue_packs_with_one_warning(monkeypatch):
    """A Python without its headers cannot build the extension: one warning, and the Python
    glue (ctypes) packs the step, as before the extension."""
    monkeypatch.setattr(cbuild, "_host", {"compiled": True})
    if not packing.enabled():
        pytest.skip(f"the compiled packing did not build: {packing.LIBRARY.reason}")
    ext = packing.EXT
    monkeypatch.setattr(packing, "EXT", cbuild.OnDemandModule(ext.name, ext.sources, ext.fallback))
    monkeypatch.setattr(cbuild, "python_include", lambda: None)
    runner = ours_from_hf(tiny_hf_model("llama"), cache_tokens=64, block_size=4)
    runner.add_sequence(0)
    runner.assume_context(0, 5)
    with pytest.warns(RuntimeWarning, match="headers.*glued in Python"):
        tokens, meta, _ = runner.prepare([StepInput(0, [1, 2], parents=[-1, 0])], reuse=True)
    assert packing.EXT.get() is None and tokens.tolist() == [1, 2] and meta.positions.tolist() == [5, 6]


@pytest.mark.parametrize("reuse", [True, False], ids=["staged", "plain"])
def test_a_step_with_a_sequence_twice_or_unknown_is_refused_before_anything_is_reserved(reuse):
    """The runner's own staged steps go to the extension first (models.packing.staged), which
    leaves these to the Python checks: a sequence twice in one step, or one the cache does not
    hold, is refused by name, and no cache room is taken."""
    staged = reuse and packing.EXT.get() is not None and packing.enabled()  # loaded: the staged path is taken
    runner = ours_from_hf(tiny_hf_model("llama"), cache_tokens=64, block_size=4)
    for s in (0, 1):
        runner.add_sequence(s)
    free = list(runner.cache.free_blocks)
    with pytest.raises(ValueError, match="only once"):
        runner.prepare([StepInput(0, [1, 2]), StepInput(1, [3]), StepInput(0, [4])], reuse=reuse)
    with pytest.raises(KeyError, match="sequence 5"):
        runner.prepare([StepInput(1, [1]), StepInput(5, [2])], reuse=reuse)
    assert runner.cache.free_blocks == free and all(not b for b in runner.cache.blocks.values())
    tokens, meta, _ = runner.prepare([StepInput(1, [7, 8]), StepInput(0, [9])], reuse=reuse)  # still packs
    assert tokens.tolist() == [7, 8, 9] and meta.cu_seqlens_q.tolist() == [0, 2, 3]
    in_staging = tokens.untyped_storage().data_ptr() == packing.thread_staging().v64.untyped_storage().data_ptr()
    assert in_staging == staged
