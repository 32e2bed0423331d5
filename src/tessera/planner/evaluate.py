"""Score a layout: the largest multiple of the demand mix it serves within the SLO.

The layout's replicas are grouped by shape (identical replicas share load evenly at an
optimum, by symmetry and convexity), and the makespan LP of ``tessera.planner.assign`` is
solved over the groups: its optimum ``t`` is the largest utilization needed to serve the
demand, so ``scale = 1 / t`` is how far the whole mix could grow. When some class has no
capacity at all the score falls back to the served fraction of the throughput LP minus
one (in [-1, 0)), so any layout serving every class ranks above one that does not.
Called by ``search``, ``moves``, ``exhaustive`` and ``homogeneous``; results are cached
per shape multiset inside one :class:`Evaluator`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.planner import assign
from tessera.planner.capacity_table import CapacityTable
from tessera.planner.layout import Layout
from tessera.planner.shapes import Shape


@dataclass(frozen=True)
class Evaluation:
    """Objective of one layout and the aggregated LP behind it."""

    score: float  # scale if every class is served, else served fraction - 1
    scale: float  # largest multiple of the demand served within the SLO (0 if not all)
    shapes: tuple[Shape, ...]  # LP groups
    counts: tuple[int, ...]  # replicas per group
    assignment: assign.Assignment | None  # makespan LP over groups (None if infeasible)


class Evaluator:
    """Evaluates layouts against one demand vector, caching by shape multiset."""

    def __init__(self, table: CapacityTable, demand: tuple[float, ...]) -> None:
        total = sum(demand)
        if total <= 0:
            raise ValueError("demand must be positive")
        self.table = table
        self.demand = demand
        self.calls = 0  # LP solves performed
        self._cache: dict[tuple[tuple[Shape, int], ...], Evaluation] = {}

    def __call__(self, layout: Layout) -> Evaluation:
        key = layout.shape_counts()
        found = self._cache.get(key)
        if found is None:
            found = self._evaluate(key)
            self._cache[key] = found
        return found

    def _evaluate(self, key: tuple[tuple[Shape, int], ...]) -> Evaluation:
        self.calls += 1
        shapes = tuple(s for s, _ in key)
        counts = tuple(n for _, n in key)
        capacity = tuple(
            tuple(n * r for r in self.table.rates(s)) for s, n in zip(shapes, counts, strict=True)
        )
        problem = assign.AssignmentProblem(demand=self.demand, capacity=capacity)
        total = sum(self.demand)
        try:
            result = assign.solve(problem, "makespan")
        except assign.InfeasibleError:
            served = assign.solve(problem, "throughput").value if shapes else 0.0
            return Evaluation(served / total - 1.0, 0.0, shapes, counts, None)
        scale = 1.0 / result.value if result.value > 0 else float("inf")
        return Evaluation(scale, scale, shapes, counts, result)
