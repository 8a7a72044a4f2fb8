"""The compiled twin of a step's host work (``decoding/cpu/*.c``), beside the Python it speeds up.

The step planner's per-step work (``decoding/cpu/planner.c``): ``Planner.max_depth``,
``Planner.select`` and ``Planner.observe`` over acceptance estimates kept in dense arrays
(``ArrayAcceptance``). The Python methods stay the readable reference; the compiled functions
do their arithmetic in their order in doubles, so plans, selections and what is learnt are the
same bit for bit (tests/test_compiled.py holds them equal on exact tables and random steps).

Built on first use with the system C compiler like the CPU kernels (``kernels/cbuild.py``),
with portable flags (no instruction-set extension: it builds wherever there is a C compiler,
the GPU machine's included). Where it cannot build, the reference runs and one warning says
why. ``use_compiled(False)`` (or ``SPECDEC_HOST=ref`` in the environment, read once) runs
the reference, for comparison (the same switch as the step's packing, models/packing.py);
``path()`` says which runs, for the benchmark's header.
"""

import ctypes
import dataclasses
import math
from array import array
from pathlib import Path
from typing import Optional

from kernels import cbuild

SOURCES = [Path(__file__).with_name("cpu") / "planner.c"]
FLAGS = ["-O2", "-std=c11", "-ffp-contract=off", "-shared", "-fPIC"]
LIBS = ["-lm"]


def _declare(lib: ctypes.CDLL) -> None:
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.planner_n_keys.restype = i
    lib.planner_max_depth.argtypes = [p, p, p, i, i, ctypes.c_double, p]
    lib.planner_max_depth.restype = i
    lib.planner_select.argtypes = [p, p, p, i] + [p] * 8 + [ctypes.c_double, ctypes.c_double, p, p, p]
    lib.planner_select.restype = i
    lib.planner_observe.argtypes = [p, p, i] + [p] * 5 + [p, i, p, p, p]
    lib.planner_observe.restype = i
    lib.planner_observe_batch.argtypes = [p, p, i] + [p] * 6 + [p, p, p, p, p]
    lib.planner_observe_batch.restype = i
    if lib.planner_n_keys() != N_KEYS:
        raise RuntimeError(f"planner.c has {lib.planner_n_keys()} keys, compiled.py {N_KEYS}")


# the library, built on first use (planner_core, available)
LIBRARY = cbuild.OnDemand("decoding-host", SOURCES, FLAGS, LIBS, _declare, "the step planner runs its Python reference")
# the glue of select / observe_all / max_depth in C (decoding/cpu/glue.c, a CPython extension calling the
# library's functions by their addresses), built on first use where this Python's headers are installed
EXT = cbuild.OnDemandModule("_decoding_glue", [SOURCES[0].with_name("glue.c"), SOURCES[0].with_name("glue_step.c")],
                            "the planner's compiled calls are glued in Python (ctypes)")


def use_extension(on: bool) -> bool:
    """Glue the host path's compiled calls in the extensions (True) or in Python (False, for
    comparison and tests): ``kernels.cbuild.set_host_glue``, the packing's glue too; returns the
    previous setting. Planners made before keep theirs."""
    return cbuild.set_host_glue(on)


def glue():
    """The extension's module where it is switched on and built, else None."""
    return EXT.get() if cbuild.host_glue() else None


def maker(cls: type):
    """How the glue makes an instance of ``cls`` (decoding/cpu/glue_step.c ``make``): ``(cls, field
    names)`` where ``cls`` is a dataclass whose generated ``__init__`` only assigns its fields in
    order (the glue then sets them on ``object.__new__(cls)``, the same instance without the call's
    Python frame: after a forward each frame costs its lines from memory), else ``cls`` itself
    (called, its own ``__init__`` run)."""
    params = getattr(cls, "__dataclass_params__", None)
    code = getattr(cls.__dict__.get("__init__"), "__code__", None)  # the generated one was compiled from a string
    if (params is None or not params.init or params.frozen or hasattr(cls, "__post_init__")
            or "__slots__" in cls.__dict__ or getattr(code, "co_filename", None) != "<string>"):
        return cls
    names = []
    for f in dataclasses.fields(cls):  # the generated __init__ assigns an init=False field its plain default
        if not f.init and f.default is dataclasses.MISSING:
            return cls
        names.append(f.name)
    return cls, tuple(names)


def available() -> bool:
    """Whether the compiled host path is built (builds it on the first call)."""
    return LIBRARY.get() is not None


def use_compiled(on: bool) -> bool:
    """Run the compiled host path where it is available (True) or the Python reference (False)
    from now on; returns the previous setting. Objects made before keep the path they chose."""
    return cbuild.set_host_compiled(on)


def enabled() -> bool:
    """The compiled path is switched on and built."""
    return cbuild.host_compiled() and available()


def path() -> str:
    """Which host path new planners take: "compiled", or "reference (why)"."""
    if not cbuild.host_compiled():
        return "reference (switched to it)"
    return "compiled" if available() else f"reference ({LIBRARY.reason})"


# ---- acceptance estimates in dense arrays --------------------------------------------------------
# the key caps of decoding/planner.py, and the index planner.c's key_index computes
MAX_DEPTH_KEY, MAX_RANK_KEY = 8, 3
N_BIT_IDX = 10  # bit 0 and the 9 source bits of decoding/tree.py
N_KEYS = N_BIT_IDX * (MAX_DEPTH_KEY + 1) * (MAX_RANK_KEY + 1) * 2 * 3


def key_index(key) -> int:
    """The array index of an ``AcceptKey`` (bit, depth, rank, streak, backed)."""
    bit, depth, rank, streak, backed = key
    return (((bit.bit_length() * (MAX_DEPTH_KEY + 1) + depth) * (MAX_RANK_KEY + 1) + rank) * 2 + int(streak)) * 3 \
        + backed


class PlanCfg(ctypes.Structure):
    _fields_ = ([(n, ctypes.c_double) for n in ("prior", "prior_weight", "explore", "decay", "min_gain")]
                + [(n, ctypes.c_int) for n in ("max_tokens", "max_step_tokens", "learn_overhead")]
                + [(n, ctypes.c_double) for n in ("overhead_ms", "overhead_per_token", "mean_x")])


class PlanCost(ctypes.Structure):
    _fields_ = [("curve", ctypes.c_void_p), ("slope", ctypes.c_void_p), ("curve_len", ctypes.c_int),
                ("slope_len", ctypes.c_int), ("per_seq_ms", ctypes.c_double), ("floor_ms", ctypes.c_double),
                ("context", ctypes.c_int64), ("span", ctypes.c_int64), ("contexts", ctypes.c_void_p)]


class PlanAcc(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("hits", "trials", "shared_hits", "shared_trials")] + \
        [("streak", ctypes.c_int)]


def _ptr(a: array, offset: int = 0) -> int:
    return a.buffer_info()[0] + offset * a.itemsize


class PlannerCore:
    """The compiled calls of one ``Planner`` whose cost is a ``models.cost.StepCost``: the
    cost's curve and attention slope tabulated (by its own methods, so the values are the
    reference's) and grown as steps need, and each step's trees flattened once for ``select``
    and ``observe``."""

    def __init__(self, lib: ctypes.CDLL, cost):
        self.lib, self.cost = lib, cost
        # the tables start as copies of the longest an earlier planner of this cost made (the same
        # values: the cost's own, memoised): the bench makes a planner per generate call, and each
        # first step tabulated its hundreds of entries one Python call each
        done = cost.__dict__.get("_planner_tables")
        self.curve, self.slope = (array("d", done[0]), array("d", done[1])) if done else (array("d"), array("d"))
        self.has_slope = cost.long_context > cost.context
        self._flat: Optional[tuple] = None  # the last select's trees and their arrays
        # the call's structures, kept between steps (a step changes a few of their fields)
        self._cost_args = PlanCost(None, None, 0, 0, cost.per_seq_ms, 0.5 * cost.ms[0], cost.context,
                                   cost.long_context - cost.context if self.has_slope else 0, None)
        if self.curve:
            self._point()
        self._cfg_args: Optional[PlanCfg] = None
        self._accs_of: dict[tuple, ctypes.Array] = {}
        # the committed lengths the cost was last given: the planner's list (a step's max_depth and
        # select share it) and its array
        self._ctx_list: Optional[list] = None
        self._ctx_buf: Optional[array] = None
        # the extension's glue, with the library's functions' addresses, or None: the Python glue below
        self._ext = glue()
        if self._ext is not None:
            self._fn = {name: ctypes.cast(getattr(lib, f"planner_{name}"), ctypes.c_void_p).value
                        for name in ("select", "observe_batch", "max_depth")}
        self._flat_ext: Optional[tuple] = None  # the last select's trees and their flattened bytes (extension)
        self._cost_at = ctypes.addressof(self._cost_args)
        self._cfg_at = 0  # the config's address, once it is made (_prepare)
        self._ready: Optional[tuple] = None  # what the last _prepare made ready: (sids, contexts, version, entry)

    # A call's Python costs microseconds per function it goes through when the step's forward
    # has left the caches cold (an empty call about 2, a ctypes call 6: bench/results/
    # 2026-11-28-cpu-one-call/NOTES.md), so each call below brings every structure up to date in
    # one function (_prepare) rather than one helper per structure.
    def _prepare(self, planner, sids: list[int], total: int = 0, per_seq: int = 0) -> list:
        """The structures of a call for the batch ``sids``, brought up to date: the cost's tables
        holding ``total`` step tokens and ``per_seq`` for one sequence, the batch's committed
        lengths (the planner's, else none), the learnt host time, the sequences' estimates and
        their streaks. Returns the estimates' entry: [array, its address, the streaks' version].
        The calls of one step (max_depth, select, observe_all) find all of it as the first left
        it, unless the tables must grow."""
        ready = self._ready
        if ready is not None and ready[1] is planner.contexts and ready[2] == planner.version and \
                ready[0] == sids and len(self.curve) > total and (not self.has_slope or len(self.slope) > per_seq):
            return ready[3]
        s = self._cost_args
        if len(self.curve) <= total or (self.has_slope and len(self.slope) <= per_seq):
            cost = self.cost
            while len(self.curve) <= total:
                self.curve.append(cost.curve(len(self.curve)))
            while self.has_slope and len(self.slope) <= per_seq:
                self.slope.append(cost.attention_slope(len(self.slope)))
            self._point()
            done = cost.__dict__.get("_planner_tables")
            if done is None or len(done[0]) < len(self.curve) or len(done[1]) < len(self.slope):
                cost._planner_tables = (array("d", self.curve), array("d", self.slope))
        ctx = planner.contexts
        if ctx is not None and len(ctx) == len(sids):
            if ctx is not self._ctx_list:  # a new step's list (the old one is held: a new list is another object)
                self._ctx_list, self._ctx_buf = ctx, array("q", ctx)
            s.contexts = self._ctx_buf.buffer_info()[0]
        else:
            s.contexts = None
        c = self._cfg_args
        if c is None:
            k = planner.cfg
            c = self._cfg_args = PlanCfg(k.prior, k.prior_weight, k.explore, k.decay, k.min_gain, k.max_tokens,
                                         -1 if k.max_step_tokens is None else k.max_step_tokens, k.learn_overhead)
            self._cfg_at = ctypes.addressof(c)
        o = planner._ovh  # planner._mean_x, written out
        c.overhead_ms, c.overhead_per_token, c.mean_x = planner.overhead_ms, planner.overhead_per_token, \
            o[1] / o[0] if o[0] > 0 else 0.0
        key = tuple(sids)
        entry = self._accs_of.get(key)
        if entry is None:
            if len(self._accs_of) > 64:  # batches shrink as sequences finish: a few shapes per call
                self._accs_of.clear()
            accs = (PlanAcc * max(1, len(sids)))()
            sh = planner.shared
            for a, sid in zip(accs, sids):
                acc = planner.acceptance(sid)
                a.hits, a.trials = _ptr(acc.hits), _ptr(acc.trials)
                a.shared_hits, a.shared_trials = _ptr(sh.hits), _ptr(sh.trials)
            entry = self._accs_of[key] = [accs, ctypes.addressof(accs), -1]
        if entry[2] != planner.version:  # a step was learnt from since: the streaks may have changed
            seq_acc = planner.seq_acc
            for a, sid in zip(entry[0], sids):
                a.streak = seq_acc[sid].streak
            entry[2] = planner.version
        self._ready = (list(sids), planner.contexts, planner.version, entry)
        return entry

    def _point(self) -> None:
        """The call's structure pointed at the tables (after they grew: an array may move)."""
        s = self._cost_args
        s.curve, s.curve_len = _ptr(self.curve), len(self.curve)
        s.slope, s.slope_len = (_ptr(self.slope) if self.has_slope else None), len(self.slope)

    def forward_ms(self, step_tokens: list[int], contexts: Optional[list[int]]) -> tuple[float, float]:
        """The cost's ``(cost(step_tokens, contexts), cost([1] * len(step_tokens), contexts))``
        from its tables (``StepCost.__call__``'s sums in its order; ``contexts`` None or of
        another length: the measured context), for the planner's ``observe_time``."""
        cost, B = self.cost, len(step_tokens)
        total = sum(step_tokens)
        if not B or len(self.curve) <= total or (self.has_slope and len(self.slope) <= max(step_tokens)):
            return cost(step_tokens, contexts), cost([1] * B, contexts)
        extra = cost.per_seq_ms * max(0, B - 1)
        ms, one = self.curve[total] + extra, self.curve[B] + extra
        if contexts is not None and self.has_slope and len(contexts) == B:
            base, span, slope = cost.context, cost.long_context - cost.context, self.slope
            for t, c in zip(step_tokens, contexts):
                ms += slope[t] * (c - base) / span
            for c in contexts:
                one += slope[1] * (c - base) / span
        floor = 0.5 * cost.ms[0]
        return max(ms, floor), max(one, floor)

    def max_depth(self, planner, sids: list[int], sources: int) -> Optional[list[int]]:
        B, m = len(sids), planner.cfg.max_tokens
        accs = self._prepare(planner, sids, B + m, m)
        if self._ext is not None:
            return self._ext.max_depth(self._fn["max_depth"], self._cfg_at, self._cost_at, accs[1], B, sources,
                                       planner._calibration)
        out = array("i", bytes(4 * B))
        rc = self.lib.planner_max_depth(self._cfg_at, self._cost_at, accs[0], B, sources, planner._calibration,
                                        _ptr(out))
        if rc != 0:
            return None
        return out.tolist()

    def flatten(self, trees: list) -> tuple:
        parents, depths, sources, group, candidate = array("i"), array("i"), array("i"), array("i"), array("b")
        offsets = array("i", [0])
        for t in trees:
            flat = getattr(t, "flat", None)  # a tree built in C (compiled_draft.BuiltTree): its arrays
            if flat is not None and len(flat[0]) == len(t.parents):
                for a, f in zip((parents, depths, sources, group, candidate), flat):
                    a.extend(f)
            else:
                parents.extend(t.parents)
                depths.extend(t.depths)
                sources.extend(t.sources)
                group.extend(t.group)
                candidate.extend(t.candidate)
            offsets.append(len(parents))
        return trees, offsets, parents, depths, sources, group, candidate

    def select(self, planner, sids: list[int], trees: list, pinned: list[list[int]]
               ) -> Optional[tuple[list[list[int]], list[float]]]:
        B = len(trees)
        self._flat = self._flat_ext = None
        plain, total, longest = self._ext is not None, B, planner.cfg.max_tokens
        for t in trees:  # the sizes, and whether any tree has pinned nodes or a proposer's own chances
            n = len(t.tokens)  # not len(t): StepTree.__len__ is a call of its own
            total += n
            longest = n if n > longest else longest
            plain = plain and not t.pinned and not t.chance
        ready = self._ready  # _prepare's test of whether all is ready, written out (a call is a step's cost)
        if ready is not None and ready[1] is planner.contexts and ready[2] == planner.version and \
                ready[0] == sids and len(self.curve) > total and (not self.has_slope or len(self.slope) > longest + 1):
            accs = ready[3]  # as the step's max_depth left it
        else:
            accs = self._prepare(planner, sids, total, longest + 1)
        if plain:
            done = self._ext.select(self._fn["select"], self._cfg_at, self._cost_at, accs[1], trees,
                                    planner._calibration, planner._window_rate)
            if done is not None:
                self._flat_ext = (trees, done[2])
                return done[0], done[1]
        flat = self._flat = self.flatten(trees)
        _, offsets, parents, depths, sources, group, candidate = flat
        N = offsets[-1]
        pin = chance = None
        if any(pinned):
            pin = array("b", bytes(N))
            for o, p in zip(offsets, pinned):
                for n in p:
                    pin[o + n] = 1
        if any(t.chance for t in trees):
            chance = array("d", [math.nan]) * N
            for o, t in zip(offsets, trees):
                for n, c in t.chance.items():
                    chance[o + n] = c
        kept, n_kept, expected = array("i", bytes(4 * N)), array("i", bytes(4 * B)), array("d", bytes(8 * B))
        rc = self.lib.planner_select(self._cfg_at, self._cost_at, accs[0], B,
                                     _ptr(offsets), _ptr(parents), _ptr(depths), _ptr(sources), _ptr(group),
                                     _ptr(candidate), None if pin is None else _ptr(pin),
                                     None if chance is None else _ptr(chance), planner._calibration,
                                     planner._window_rate, _ptr(kept), _ptr(n_kept), _ptr(expected))
        if rc != 0:
            return None
        return [kept[o:o + n].tolist() for o, n in zip(offsets, n_kept)], expected.tolist()

    def observe(self, planner, acc, outcome) -> tuple[int, int]:
        tree = outcome.tree
        flat = self._flat
        b = next((i for i, t in enumerate(flat[0]) if t is tree), None) if flat is not None else None
        if b is None:
            flat, b = self.flatten([tree]), 0
        _, offsets, parents, depths, sources, group, candidate = flat
        o, n = offsets[b], offsets[b + 1] - offsets[b]
        on_path = array("b", bytes(n))
        for node in outcome.path:
            on_path[node] = 1
        rows = array("i", outcome.rows)
        a = PlanAcc(_ptr(acc.hits), _ptr(acc.trials), _ptr(planner.shared.hits), _ptr(planner.shared.trials),
                    acc.streak)
        credit, columns = ctypes.c_int(), ctypes.c_int()
        self._prepare(planner, [])
        rc = self.lib.planner_observe(self._cfg_at, ctypes.byref(a), n, _ptr(parents, o),
                                      _ptr(depths, o), _ptr(sources, o), _ptr(group, o), _ptr(candidate, o),
                                      _ptr(rows), len(rows), _ptr(on_path), ctypes.byref(credit),
                                      ctypes.byref(columns))
        if rc != 0:
            raise MemoryError("planner_observe could not allocate its buffers")
        return credit.value, columns.value


    def observe_all(self, planner, sids: list[int], outcomes: list) -> Optional[tuple[int, int]]:
        """``observe`` of a whole step in one call, when its outcomes are of the trees the last
        ``select`` flattened, in that order (None otherwise: observe them one by one)."""
        fx = self._flat_ext
        if fx is not None and len(fx[0]) == len(outcomes):
            for o, t in zip(outcomes, fx[0]):
                if o.tree is not t:
                    break
            else:
                ready = self._ready  # _prepare's test, written out: select left all of it ready
                ready = ready[3] if ready is not None and ready[1] is planner.contexts and \
                    ready[2] == planner.version and ready[0] == sids else self._prepare(planner, sids)
                done = self._ext.observe_all(self._fn["observe_batch"], self._cfg_at, ready[1], fx[1], outcomes)
                if done is not None:
                    return done
            self._flat = self.flatten(fx[0])
        flat = self._flat
        if flat is None or len(flat[0]) != len(outcomes) or any(o.tree is not t for o, t in zip(outcomes, flat[0])):
            return None
        _, offsets, parents, depths, sources, group, candidate = flat
        on_path, rows, row_offsets = array("b", bytes(offsets[-1])), array("i"), array("i", [0])
        for o, out in zip(offsets, outcomes):
            for node in out.path:
                on_path[o + node] = 1
            rows.extend(out.rows)
            row_offsets.append(len(rows))
        accs = self._prepare(planner, sids)[0]
        credit, columns = ctypes.c_int(), ctypes.c_int()
        rc = self.lib.planner_observe_batch(self._cfg_at, accs, len(sids), _ptr(offsets),
                                            _ptr(parents), _ptr(depths), _ptr(sources), _ptr(group), _ptr(candidate),
                                            _ptr(row_offsets), _ptr(rows) if rows else None, _ptr(on_path),
                                            ctypes.byref(credit), ctypes.byref(columns))
        if rc != 0:
            raise MemoryError("planner_observe_batch could not allocate its buffers")
        return credit.value, columns.value


    def observe_step(self, planner, sids: list[int], outcomes: list, step_tokens: list[int], wall_ms: float,
                     new_tokens: int, model_ms: float, constants: tuple, sources: Optional[int]):
        """``Planner.observe_all`` then ``observe_time`` in one call of the extension, when the
        outcomes are of the trees the last ``select`` flattened, in that order; None (nothing
        learnt) otherwise: the planner then calls the two. ``constants``: the calibration's
        decay, weight and floor, the config's window rate and weight and calibrate flag. With
        ``sources`` (the proposer's, as the step's ``max_depth`` had them) the same call plans the
        next step's depths for these sequences over their grown contexts and answers (depths,
        contexts), its structures left ready as ``_prepare`` would leave them for those; else True."""
        fx = self._flat_ext
        if self._ext is None or fx is None or len(fx[0]) != len(outcomes):
            return None
        for o, t in zip(outcomes, fx[0]):
            if o.tree is not t:
                return None
        ready = self._ready  # _prepare's test, written out: select left all of it ready
        entry = ready[3] if ready is not None and ready[1] is planner.contexts and \
            ready[2] == planner.version and ready[0] == sids else self._prepare(planner, sids)
        buf = array("q", bytes(8 * len(sids)))
        done = self._ext.observe_step(self._fn["observe_batch"], self._cfg_at, entry[1], fx[1], outcomes, planner,
                                      sids, step_tokens, wall_ms, new_tokens, model_ms, self._cost_at, constants,
                                      self._fn["max_depth"], -1 if sources is None else sources, buf)
        if done is not None and done is not True:  # the next step's contexts and streaks are in place
            entry[2] = planner.version
            self._ctx_list, self._ctx_buf = done[1], buf
            self._cost_args.contexts = buf.buffer_info()[0]
            self._ready = (list(sids), done[1], planner.version, entry)
        return done


def planner_core(cost) -> Optional[PlannerCore]:
    """The compiled calls for a planner with ``cost``, or None: the reference then runs (the
    path is switched off or did not build, or the cost is not a tabulable ``StepCost``)."""
    from models.cost import StepCost

    if not isinstance(cost, StepCost) or not enabled():
        return None
    return PlannerCore(LIBRARY.lib, cost)
