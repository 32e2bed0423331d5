"""Per-shape, per-class capacities of a planning problem, with dominated shapes pruned.

For every structurally valid :class:`~tessera.planner.shapes.Shape` this builds the
replica's stage layer ranges (``tessera.planner.stages``), checks that every GPU fits its
weights plus the KV cache of one sequence of the longest class, and prices each class
with ``tessera.cost.capacity.replica_capacity``. Capacities do not depend on demand, so
one table serves every demand mix of the same problem (the benchmark reuses it).

Pruning is exact: a shape is dropped when some set of copies of another shape fits in the
GPUs it occupies and serves at least as much of every class (a set of replicas with
summed capacity vector c can serve any mix one replica with capacity c can). Replacing the
dropped shape by those copies never lowers the objective, so the search space keeps an
optimum. Called by ``tessera.planner.search``, ``exhaustive`` and ``deployment``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from tessera.cost import capacity, latency
from tessera.cost.capacity import Capacity, ReplicaLayout
from tessera.planner import shapes, stages
from tessera.planner.problem import PlanningProblem
from tessera.planner.shapes import Shape


@dataclass(frozen=True)
class ShapeInfo:
    """A priced shape."""

    shape: Shape
    layer_ranges: tuple[tuple[int, int], ...]  # [start, end) per stage
    capacities: tuple[Capacity, ...]  # per class
    rates: tuple[float, ...]  # per class req/s (capacities[j].rate)


@dataclass(frozen=True)
class CapacityTable:
    """Priced, non-dominated shapes of one problem."""

    node_sizes: Counter[int]  # node GPU count -> number of such nodes in the pool
    infos: Mapping[Shape, ShapeInfo]  # every feasible priced shape (dominated ones too)
    kept: tuple[Shape, ...]  # non-dominated feasible shapes, canonical order
    infeasible: tuple[Shape, ...]  # shapes whose weights + one sequence's KV do not fit

    def local_shapes(self, node_size: int) -> tuple[Shape, ...]:
        """Kept single-node shapes that fit a node of ``node_size`` GPUs."""
        return tuple(s for s in self.kept if s.span == 1 and s.gpus <= node_size)

    def span_shapes(self, node_size: int, nodes: int) -> tuple[Shape, ...]:
        """Kept multi-node shapes over nodes of ``node_size`` GPUs, at most ``nodes`` wide."""
        return tuple(
            s for s in self.kept if s.span > 1 and s.span <= nodes and s.node_gpus() == node_size
        )

    def rates(self, shape: Shape) -> tuple[float, ...]:
        """Per-class capacity of ``shape``."""
        return self.infos[shape].rates


def replica_layout(
    problem: PlanningProblem, shape: Shape, ranges: tuple[tuple[int, int], ...]
) -> ReplicaLayout:
    """The cost model's view of a replica of ``shape`` with the given layer ranges."""
    comm = problem.comm
    specs = []
    for s, (start, end) in enumerate(ranges):
        last = s == shape.pp - 1
        hop = None
        if not last:
            crosses = (s + 1) % shape.stages_per_node == 0
            hop = comm.inter_node if crosses else comm.intra_node
        specs.append(latency.StageSpec(layers=end - start, first=s == 0, last=last, hop=hop))
    return ReplicaLayout(
        tp=shape.tp,
        stages=tuple(specs),
        gpu_memory_bytes=problem.gpu_memory_bytes,
        intra=comm.intra_node,
    )


def _reference_point(problem: PlanningProblem) -> tuple[float, float]:
    demand = problem.demand
    total = sum(demand)
    context = sum(
        d * (c.input_tokens + c.output_tokens / 2)
        for d, c in zip(demand, problem.classes, strict=True)
    )
    return 32.0, context / total


def build_table(problem: PlanningProblem) -> CapacityTable:
    """Price every valid shape of ``problem`` and prune dominated ones."""
    model = problem.profile.model
    sizes: Counter[int] = Counter(len(n.gpus) for n in problem.nodes)
    batch, context = _reference_point(problem)
    costs = stages.reference_costs(problem.profile, batch, context)
    longest = max(c.input_tokens + c.output_tokens for c in problem.classes)
    ranges_by_pp: dict[int, tuple[tuple[int, int], ...]] = {}
    infos: dict[Shape, ShapeInfo] = {}
    infeasible: list[Shape] = []
    for shape in shapes.enumerate_shapes(model, sizes, problem.max_pp, problem.max_tp):
        if shape.pp not in ranges_by_pp:
            ranges_by_pp[shape.pp] = stages.balance_layers(model.num_layers, shape.pp, costs)
        ranges = ranges_by_pp[shape.pp]
        layout = replica_layout(problem, shape, ranges)
        if capacity.kv_batch_limit(problem.profile, layout, longest, problem.capacity_options) < 1:
            infeasible.append(shape)
            continue
        caps = tuple(
            capacity.replica_capacity(
                problem.profile, layout, c, problem.slo, problem.capacity_options
            )
            for c in problem.classes
        )
        infos[shape] = ShapeInfo(shape, ranges, caps, tuple(c.rate for c in caps))
    useful = [s for s in infos if any(r > 0 for r in infos[s].rates)]
    kept = tuple(s for s in useful if not _dominated(s, useful, infos))
    return CapacityTable(
        node_sizes=sizes,
        infos=infos,
        kept=tuple(sorted(kept, key=Shape.sort_key)),
        infeasible=tuple(infeasible),
    )


def _dominated(shape: Shape, pool: list[Shape], infos: Mapping[Shape, ShapeInfo]) -> bool:
    """Whether copies of another shape, fitting in ``shape``'s GPUs, serve at least as much
    of every class (strictly more of one, or equal and canonically earlier)."""
    mine = infos[shape].rates
    for other in pool:
        if other == shape:
            continue
        copies = shapes.copies_within(other, shape)
        if copies < 1:
            continue
        theirs = [copies * r for r in infos[other].rates]
        if all(t >= m * (1 - 1e-12) for t, m in zip(theirs, mine, strict=True)):
            strictly = any(t > m * (1 + 1e-12) for t, m in zip(theirs, mine, strict=True))
            if strictly or other.sort_key() < shape.sort_key():
                return True
    return False
