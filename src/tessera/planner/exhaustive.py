"""Exhaustive search over layouts, for small clusters (tests and benchmarks).

Enumerates, per node size, every multiset of *maximal* node configurations (no further
kept shape fits in the free GPUs) together with every multiset of spanning replicas, and
scores each with ``tessera.planner.evaluate``. Restricting to maximal configurations and
to non-dominated shapes (``capacity_table``) is exact: adding a replica or swapping a
dominated shape for its dominating copies never lowers the objective. The result is the
optimum of the planner's search space, against which the heuristic is measured.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from tessera.planner import layout as layout_mod
from tessera.planner.capacity_table import CapacityTable
from tessera.planner.evaluate import Evaluation, Evaluator
from tessera.planner.layout import GroupLayout, Layout, NodeConfig
from tessera.planner.shapes import Shape

MAX_LAYOUTS = 2_000_000  # refuse clusters whose layout count exceeds this


@dataclass(frozen=True)
class ExhaustiveResult:
    """Optimal layout and how many layouts were scored."""

    layout: Layout
    evaluation: Evaluation
    layouts: int


def maximal_configs(shapes: tuple[Shape, ...], node_gpus: int) -> list[NodeConfig]:
    """All multisets of ``shapes`` fitting ``node_gpus`` to which no shape can be added."""
    fitting = [s for s in shapes if s.span == 1 and s.gpus <= node_gpus]
    if not fitting:
        return [()]
    smallest = min(s.gpus for s in fitting)
    out: list[NodeConfig] = []

    def extend(start: int, free: int, chosen: list[Shape]) -> None:
        if free < smallest:
            out.append(layout_mod.node_config(chosen))
            return
        for i in range(start, len(fitting)):
            if fitting[i].gpus <= free:
                chosen.append(fitting[i])
                extend(i, free - fitting[i].gpus, chosen)
                chosen.pop()
        # a config whose free GPUs fit only shapes earlier in the order is reached through
        # those shapes' branch; nothing to emit here

    extend(0, node_gpus, [])
    return sorted(set(out), key=lambda c: tuple(s.sort_key() for s in c))


def _group_layouts(table: CapacityTable, size: int, nodes: int) -> Iterator[GroupLayout]:
    configs = maximal_configs(table.local_shapes(size), size)
    spans = table.span_shapes(size, nodes)

    def span_sets(i: int, free: int) -> Iterator[Counter[Shape]]:
        if i == len(spans):
            yield Counter()
            return
        shape = spans[i]
        for n in range(free // shape.span + 1):
            for rest in span_sets(i + 1, free - n * shape.span):
                out = Counter(rest)
                if n:
                    out[shape] = n
                yield out

    for span_set in span_sets(0, nodes):
        left = nodes - sum(s.span * n for s, n in span_set.items())
        for combo in itertools.combinations_with_replacement(range(len(configs)), left):
            chosen: Counter[NodeConfig] = Counter(configs[i] for i in combo)
            yield layout_mod.make_group(size, nodes, chosen, span_set)


def layouts(table: CapacityTable) -> Iterator[Layout]:
    """Every layout :func:`search` scores, in its order (the latency objective's bench)."""
    sizes = sorted(table.node_sizes.items(), reverse=True)
    per_group = [list(_group_layouts(table, size, nodes)) for size, nodes in sizes]
    for groups in itertools.product(*per_group):
        yield Layout(tuple(groups))


def count_layouts(table: CapacityTable) -> int:
    """Number of layouts :func:`search` would score (before caching)."""
    total = 1
    for size, nodes in table.node_sizes.items():
        total *= sum(1 for _ in _group_layouts(table, size, nodes))
    return total


def search(table: CapacityTable, evaluator: Evaluator) -> ExhaustiveResult:
    """Score every layout; return the best (first in enumeration order on ties)."""
    sizes = sorted(table.node_sizes.items(), reverse=True)
    per_group = [list(_group_layouts(table, size, nodes)) for size, nodes in sizes]
    total = 1
    for options in per_group:
        total *= len(options)
    if total > MAX_LAYOUTS:
        raise ValueError(f"{total} layouts exceed the exhaustive limit of {MAX_LAYOUTS}")
    best: tuple[Layout, Evaluation] | None = None
    for groups in itertools.product(*per_group):
        candidate = Layout(tuple(groups))
        evaluation = evaluator(candidate)
        if best is None or evaluation.score > best[1].score * (1 + 1e-12) + 1e-15:
            best = (candidate, evaluation)
    assert best is not None
    return ExhaustiveResult(best[0], best[1], total)
