"""The lookahead n-gram pool: n-grams keyed by their first token, least recently used out.
Each n-gram remembers its origin (a source bit of decoding/tree.py): taken from the text
(POOL) or produced by the lookahead window (HARVEST); the text wins when both gave it."""

from collections import OrderedDict

from decoding.tree import POOL


class NgramPool:
    """n-grams keyed by their first token; at most ``capacity`` per key, least recently
    added or refreshed dropped first."""

    def __init__(self, n: int, capacity: int):
        self.n, self.capacity = n, capacity
        self.table: dict[int, OrderedDict] = {}

    def add(self, ngram, origin: int = POOL) -> None:
        if self.capacity == 0 or len(ngram) != self.n:
            return
        slot = self.table.setdefault(ngram[0], OrderedDict())
        rest = tuple(ngram[1:])
        if rest in slot:
            slot.move_to_end(rest)
            if slot[rest] == POOL:
                origin = POOL
        slot[rest] = origin
        if len(slot) > self.capacity:
            slot.popitem(last=False)

    def add_many(self, ngrams, origin: int = POOL) -> None:
        """``add`` of each n-gram in turn."""
        for ngram in ngrams:
            self.add(ngram, origin)

    def add_all(self, tokens: list[int], start: int = 0) -> None:
        """Every n-gram of ``tokens`` that ends at an index >= ``start`` (those holding a token
        from ``start`` on), oldest first."""
        for i in range(max(0, start - self.n + 1), len(tokens) - self.n + 1):
            self.add(tokens[i:i + self.n])

    def get(self, key: int) -> list[tuple]:
        """Continuations (n - 1 tokens) after ``key``, most recent first."""
        slot = self.table.get(key)
        return list(reversed(slot)) if slot else []

    def items(self, key: int) -> list[tuple[tuple, int]]:
        """(continuation, origin) after ``key``, most recent first."""
        slot = self.table.get(key)
        return list(reversed(slot.items())) if slot else []

    def __len__(self) -> int:
        return sum(len(s) for s in self.table.values())

