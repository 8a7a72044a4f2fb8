"""Per-sequence statistics of a generate call, kept outside the decoding loop's body."""

from collections import Counter
from dataclasses import dataclass, field

from decoding.tree import SOURCE_NAMES


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
        for node in outcome.rows:
            if node == 0 or not tree.candidate[node]:
                continue
            for bit, name in SOURCE_NAMES.items():
                if tree.sources[node] & bit:
                    self.proposed[name] += 1
                    if node in on_path:
                        self.accepted[name] += 1
        self.accepted_hist[len(outcome.new_tokens)] += 1
        self.accept_lengths.append(len(outcome.new_tokens))

    def as_dict(self) -> dict:
        return {"forwards": self.forwards, "step_tokens": self.step_tokens,
                "accepted_hist": dict(sorted(self.accepted_hist.items())),
                "proposed": dict(self.proposed), "accepted": dict(self.accepted),
                "accept_lengths": list(self.accept_lengths)}
