"""Per-sequence statistics of a generate call, kept outside the decoding loop's body."""

import time
from collections import Counter
from dataclasses import dataclass, field

from decoding.tree import SOURCE_NAMES


_NAMES_OF: dict[int, list[str]] = {}  # source bits -> the names of its sources


@dataclass
class SeqStats:
    forwards: int = 0  # model calls after prefill this sequence took part in
    step_tokens: int = 0  # query tokens it put into those forwards
    accepted_hist: Counter = field(default_factory=Counter)  # tokens gained per step -> count
    proposed: Counter = field(default_factory=Counter)  # draft tokens sent per source branch
    accepted: Counter = field(default_factory=Counter)  # accepted draft tokens per source branch
    accept_lengths: list = field(default_factory=list)  # tokens gained by each step, in order

    def record(self, outcome) -> None:
        """One step's ``decoding.proposer.Outcome``."""
        tree, on_path = outcome.tree, set(outcome.path)
        self.forwards += 1
        self.step_tokens += outcome.sent
        # the sent candidates counted by (source bits, accepted) first: a step's nodes carry few
        # distinct bit sets, and a whole tree has a hundred nodes
        tally: dict[tuple[int, bool], int] = {}
        candidate, sources = tree.candidate, tree.sources
        for node in outcome.rows:
            if node and candidate[node]:
                key = (sources[node], node in on_path)
                tally[key] = tally.get(key, 0) + 1
        for (bits, accepted), n in tally.items():
            names = _NAMES_OF.get(bits)
            if names is None:
                names = _NAMES_OF[bits] = [name for bit, name in SOURCE_NAMES.items() if bits & bit]
            for name in names:
                self.proposed[name] += n
                if accepted:
                    self.accepted[name] += n
        self.accepted_hist[len(outcome.new_tokens)] += 1
        self.accept_lengths.append(len(outcome.new_tokens))

    def as_dict(self) -> dict:
        return {"forwards": self.forwards, "step_tokens": self.step_tokens,
                "accepted_hist": dict(sorted(self.accepted_hist.items())),
                "proposed": dict(self.proposed), "accepted": dict(self.accepted),
                "accept_lengths": list(self.accept_lengths)}


# The parts of a decoding step, in the order the loop runs them (``StepClock``).
PHASES = ("plan", "propose", "pack", "forward", "verify", "commit", "update")


class StepClock:
    """Where the decoding steps' wall time goes, phase by phase, summed over the steps of one
    generate call (pass one as ``generate(..., step_clock=)``). ``forward`` is the model's
    forward alone: on a GPU the clock waits for the device there (one synchronisation per step,
    which the loop's argmax needs right after anyway), so that the device's time is not
    counted in ``verify``. Every other phase is host work: the proposer's drafting
    (``propose``), the planner's budgets and subtree (``plan``), packing the step into the
    model's inputs (``pack``), reducing and verifying the logits (``verify``), committing the
    accepted K/V (``commit``), and the bookkeeping after it (``update``: the sequences' tokens,
    the proposer's and planner's state, the statistics)."""

    def __init__(self):
        self.ms = dict.fromkeys(PHASES, 0.0)
        self.steps = 0
        self._t = 0.0
        self._sync = None

    def start(self, device=None) -> None:
        """A step begins (``device``: the one whose work ``forward`` waits for)."""
        self.steps += 1
        if device is not None and device.type == "cuda":
            import torch

            self._sync = torch.cuda.synchronize
        else:
            self._sync = None
        self._device = device
        self._t = time.perf_counter()

    def mark(self, phase: str) -> None:
        """``phase`` ended now: the time since the previous mark is its."""
        if phase == "forward" and self._sync is not None:
            self._sync(self._device)
        t = time.perf_counter()
        self.ms[phase] += (t - self._t) * 1e3
        self._t = t

    def per_step(self) -> dict:
        """Mean ms per step of each phase, ``host`` (everything but the forward) and ``steps``."""
        n = max(self.steps, 1)
        out = {p: self.ms[p] / n for p in PHASES}
        out["host"] = sum(v for p, v in out.items() if p != "forward")
        out["steps"] = self.steps
        return out
