"""Token recycling (Luo et al. 2024, "Turning Trash into Treasure: Accelerating Inference of
Large Language Models with Token Recycling"): the top-k next tokens the model predicted after
each token, refreshed from every row a step computed anyway (one batched top-k on the
device), are the drafts: a tree grown breadth-first from the root through that table.

The table is per sequence by default; ``shared=True`` keeps one table for the whole batch and
every later generate call of the same proposer (the paper's global matrix: a warm start, at
the price of sequences seeing each other's predictions).
"""

from dataclasses import dataclass, field
from typing import Optional

from decoding import compiled_draft
from decoding.proposer import Budget, Context, Outcome, Proposer, SeqState
from decoding.tree import RECYCLE, StepTree

# token -> the model's top-k next tokens after it, best first (or its compiled twin,
# compiled_draft.CTable, on the compiled path)
Table = dict[int, list[int]]


@dataclass(slots=True)
class RecycleConfig:
    top_k: int = 8  # next tokens kept per token
    widths: tuple[int, ...] = (8, 3, 2, 1, 1, 1, 1)  # children per node at depth 1, 2, ... of the draft tree
    max_nodes: int = 48  # draft nodes per step at most (before the planner)
    seed_from_prompt: bool = True  # before the model predicts after a token, use what followed it in the prompt
    shared: bool = False  # one table for the batch and later calls (sequences then see each other's predictions)

    def __post_init__(self):
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if not self.widths or min(self.widths) < 1 or max(self.widths) > self.top_k:
            raise ValueError(f"widths must be a non-empty list of values in [1, top_k={self.top_k}], got {self.widths}")
        if self.max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {self.max_nodes}")


def seed_table(tokens: list[int], top_k: int, table: Optional[Table] = None) -> Table:
    """Each token's successors in ``tokens``, most recent first, distinct, at most top_k."""
    table = {} if table is None else table
    for a, b in zip(tokens, tokens[1:]):
        row = table.setdefault(a, [])
        if b in row:
            row.remove(b)
        row.insert(0, b)
        del row[top_k:]
    return table


def grow_tree(tree: StepTree, table: Table, widths: tuple[int, ...], max_depth: int, max_nodes: int,
              source: int = RECYCLE) -> None:
    """Breadth-first from the root: every node at depth d gets its token's first widths[d]
    recycled successors as children (merged with what the tree holds), parents in the order
    they were reached, until ``max_nodes`` candidates or ``max_depth``."""
    level = [0]
    for d in range(min(len(widths), max_depth)):
        nxt = []
        for node in level:
            for tok in table.get(tree.tokens[node], [])[:widths[d]]:
                child = tree.add_child(node, tok, source, max_nodes)
                if child is None:
                    return
                nxt.append(child)
        level = nxt


def refresh(table: Table, tokens: list[int], top: list[list[int]]) -> None:
    """``top[i]`` = the model's best next tokens after a row whose token is ``tokens[i]``;
    later rows overwrite earlier ones (callers put the accepted path last)."""
    if not isinstance(table, dict):  # the compiled twin, given each token's last row alone (the same
        last = dict(zip(tokens, top))  # table: keys in the order first met, each with its last row)
        table.refresh(list(last), list(last.values()))
        return
    for tok, row in zip(tokens, top):
        table[tok] = row


def new_table(compiled: bool, top_k: int) -> Table:
    """An empty table: a dict, or its compiled twin."""
    return compiled_draft.CTable(top_k) if compiled else {}


def seed_missing(table: Table, prompt: list[int], top_k: int) -> None:
    """What followed each token in the prompt (``seed_table``), for the tokens the table has
    no row for: the model's own predictions (a shared table's) win over the text."""
    if not isinstance(table, dict):
        seeded = compiled_draft.CTable(top_k)
        seeded.seed(prompt)
        seeded.merge_into(table)
        return
    for tok, row in seed_table(prompt, top_k).items():
        table.setdefault(tok, row)


@dataclass(eq=False, kw_only=True)
class RecycleState(SeqState):
    table: Table = field(default_factory=dict)


class Recycle(Proposer[RecycleState]):
    name = "recycle"
    State = RecycleState
    sources = RECYCLE

    def __init__(self, cfg: Optional[RecycleConfig] = None):
        self.cfg = cfg or RecycleConfig()
        # the compiled drafting's tree buffer, or None: the reference drafts
        self.buf = compiled_draft.TreeBuf() if compiled_draft.enabled() else None
        self.shared_table: Table = new_table(self.buf is not None, self.cfg.top_k)
        self.top_k = self.cfg.top_k

    def init_state(self, base: SeqState) -> RecycleState:
        table = self.shared_table if self.cfg.shared else new_table(self.buf is not None, self.cfg.top_k)
        if self.cfg.seed_from_prompt:
            seed_missing(table, base.prompt, self.cfg.top_k)
        return RecycleState(**base.seq_fields(), table=table)

    def propose(self, states: list[RecycleState], budgets: list[Budget], ctx: Context) -> list[StepTree]:
        if self.buf is not None:
            buf, trees = self.buf, []
            for s, b in zip(states, budgets):
                cap = min(b.max_nodes, self.cfg.max_nodes)
                buf.start(s.root, cap + 1)
                s.table.grow(buf, self.cfg.widths, b.max_depth, cap, RECYCLE)
                trees.append(buf.step_tree())
            return trees
        trees = []
        for s, b in zip(states, budgets):
            tree = StepTree.root(s.root)
            grow_tree(tree, s.table, self.cfg.widths, b.max_depth, min(b.max_nodes, self.cfg.max_nodes))
            trees.append(tree)
        return trees

    def update(self, state: RecycleState, outcome: Outcome) -> None:
        learn_from(state.table, outcome, self.cfg.top_k)


def learn_from(table: Table, outcome: Outcome, top_k: int) -> None:
    """Refresh the table from every row of the step, the accepted path last."""
    if not isinstance(table, dict) and table.learn(outcome.tree.tokens, outcome.rows, outcome.path,
                                                   outcome.top_rows(top_k)):
        return  # the compiled table, refreshed by the C glue in this order
    on_path, nodes = set(outcome.path), sorted(outcome.rows)
    nodes = [n for n in nodes if n not in on_path] + [n for n in nodes if n in on_path]
    top = outcome.top_rows(top_k)  # every row (no gathered copy of the logits), with the argmax when greedy
    tokens, rows = outcome.tree.tokens, outcome.rows
    refresh(table, [tokens[n] for n in nodes], [top[rows[n]] for n in nodes])
