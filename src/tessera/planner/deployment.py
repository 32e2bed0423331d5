"""The planner's output: concrete replicas on concrete GPUs, and per-class routing shares.

``Deployment`` is plain data: the operator's reconcile core turns its replicas into agent
plans (GPUs, tp, pp, layer range per stage), and the gateway's per-class routing hook
reads :meth:`Deployment.class_shares`. :func:`materialize` places a search layout on the
pool's nodes (spanning replicas first, then node configurations in canonical order; inside
a node, larger replicas take the lower GPU indices) and splits each shape group's LP rates
evenly over its replicas. Called by ``tessera.planner.search``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tessera import fields
from tessera.planner import assign
from tessera.planner.capacity_table import CapacityTable
from tessera.planner.evaluate import Evaluation
from tessera.planner.layout import Layout
from tessera.planner.problem import PlanningProblem
from tessera.planner.shapes import Shape

GpuRef = tuple[str, int]  # (node name, GPU index on that node)


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage: its decoder layers and its tp GPUs (all on one node)."""

    layers: tuple[int, int]  # [start, end)
    gpus: tuple[GpuRef, ...]

    def __post_init__(self) -> None:
        if not 0 <= self.layers[0] < self.layers[1]:
            raise fields.FieldError("layers", f"must be a non-empty [start, end): {self.layers}")
        if len({node for node, _ in self.gpus}) != 1:
            raise fields.FieldError("gpus", "a stage's GPUs must share one node")


@dataclass(frozen=True)
class ReplicaPlan:
    """One model replica with its own parallel layout."""

    name: str
    tp: int
    pp: int
    gpus: tuple[GpuRef, ...]  # stage 0's GPUs first
    stages: tuple[StagePlan, ...]
    capacity: tuple[float, ...]  # per class, req/s if it served only that class (model)

    def __post_init__(self) -> None:
        if len(self.stages) != self.pp:
            raise fields.FieldError("stages", f"expected {self.pp} stages, got {len(self.stages)}")
        if any(len(s.gpus) != self.tp for s in self.stages):
            raise fields.FieldError("stages", f"every stage needs tp={self.tp} GPUs")
        if tuple(g for s in self.stages for g in s.gpus) != self.gpus:
            raise fields.FieldError("gpus", "must list the stages' GPUs in order")

    def to_json(self) -> dict[str, Any]:
        """JSON form (used by ``Deployment.to_json``)."""
        return {
            "name": self.name,
            "tp": self.tp,
            "pp": self.pp,
            "gpus": [[node, idx] for node, idx in self.gpus],
            "stages": [
                {"layers": list(s.layers), "gpus": [[n, i] for n, i in s.gpus]} for s in self.stages
            ],
            "capacity_rps": list(self.capacity),
        }


@dataclass(frozen=True)
class Deployment:
    """A planned deployment and its routing shares."""

    model: str
    device: str
    profile_source: str  # "analytic" or "measured": provenance of every rate below
    method: str  # "heuristic", "exhaustive" or "homogeneous"
    classes: tuple[str, ...]
    demand: tuple[float, ...]  # req/s per class the plan was made for
    replicas: tuple[ReplicaPlan, ...]
    shares: tuple[tuple[float, ...], ...]  # [k][j]: share of class j's traffic to replica k
    utilization: tuple[float, ...]  # [k] at the planned demand
    scale: float  # the demand mix can grow by this factor within the SLO
    objective: float  # sustainable req/s at the demand mix (scale * sum(demand))
    unservable: tuple[str, ...] = ()  # classes no replica can serve within the SLO
    stats: tuple[tuple[str, float], ...] = ()  # search statistics

    def class_shares(self, class_name: str) -> dict[str, float]:
        """Routing hook: replica name -> fraction of ``class_name``'s requests."""
        j = self.classes.index(class_name)
        return {r.name: self.shares[k][j] for k, r in enumerate(self.replicas)}

    def to_json(self) -> dict[str, Any]:
        """JSON form printed by ``tessera plan --json``."""
        return {
            "model": self.model,
            "device": self.device,
            "profile_source": self.profile_source,
            "method": self.method,
            "classes": [
                {"name": name, "demand_rps": d}
                for name, d in zip(self.classes, self.demand, strict=True)
            ],
            "replicas": [
                {
                    **r.to_json(),
                    "shares": dict(zip(self.classes, self.shares[k], strict=True)),
                    "utilization": self.utilization[k],
                }
                for k, r in enumerate(self.replicas)
            ],
            "objective": {
                "sustainable_rps": self.objective,
                "scale": self.scale,
                "max_utilization": max(self.utilization, default=0.0),
                "meaning": "largest total request rate at the planned class mix that the "
                "cost model says meets the SLO",
            },
            "unservable_classes": list(self.unservable),
            "stats": dict(self.stats),
        }


def _place(
    problem: PlanningProblem, table: CapacityTable, layout: Layout
) -> list[tuple[Shape, list[StagePlan]]]:
    placed: list[tuple[Shape, list[StagePlan]]] = []
    for group in layout.groups:
        nodes = [n for n in problem.nodes if len(n.gpus) == group.node_gpus]
        cursor = 0
        for shape, count in group.spans:
            ranges = table.infos[shape].layer_ranges
            for _ in range(count):
                stages: list[StagePlan] = []
                for s, layer_range in enumerate(ranges):
                    node = nodes[cursor + s // shape.stages_per_node]
                    first = (s % shape.stages_per_node) * shape.tp
                    gpus = tuple((node.name, node.gpus[first + i]) for i in range(shape.tp))
                    stages.append(StagePlan(layer_range, gpus))
                placed.append((shape, stages))
                cursor += shape.span
        for config, count in group.configs:
            for _ in range(count):
                node = nodes[cursor]
                cursor += 1
                offset = 0
                for shape in sorted(config, key=lambda s: (-s.gpus, s.tp)):
                    stages = []
                    for s, layer_range in enumerate(table.infos[shape].layer_ranges):
                        gpus = tuple(
                            (node.name, node.gpus[offset + s * shape.tp + i])
                            for i in range(shape.tp)
                        )
                        stages.append(StagePlan(layer_range, gpus))
                    placed.append((shape, stages))
                    offset += shape.gpus
    return placed


def _group_rates(
    table: CapacityTable, evaluation: Evaluation, demand: tuple[float, ...]
) -> tuple[assign.Matrix, tuple[float, ...]]:
    """Per-group rates x[g][j] at the demand and per-group utilization."""
    if evaluation.assignment is not None:
        return evaluation.assignment.rates, evaluation.assignment.utilization
    capacity = tuple(
        tuple(n * r for r in table.rates(s))
        for s, n in zip(evaluation.shapes, evaluation.counts, strict=True)
    )
    result = assign.solve(assign.AssignmentProblem(demand, capacity), "throughput")
    return result.rates, result.utilization


def materialize(
    problem: PlanningProblem,
    table: CapacityTable,
    layout: Layout,
    evaluation: Evaluation,
    method: str,
    stats: tuple[tuple[str, float], ...] = (),
) -> Deployment:
    """Place ``layout`` on GPUs and derive per-replica routing shares."""
    demand = problem.demand
    placed = _place(problem, table, layout)
    group_index = {s: g for g, s in enumerate(evaluation.shapes)}
    rates, group_util = _group_rates(table, evaluation, demand) if placed else ((), ())
    served = [0.0] * len(demand)
    per_replica: list[tuple[float, ...]] = []
    utilization: list[float] = []
    for shape, _ in placed:
        g = group_index[shape]
        n = evaluation.counts[g]
        mine = tuple(x / n for x in rates[g])
        per_replica.append(mine)
        utilization.append(group_util[g])
        for j, x in enumerate(mine):
            served[j] += x
    replicas: list[ReplicaPlan] = []
    shares: list[tuple[float, ...]] = []
    for k, (shape, stages) in enumerate(placed):
        caps = table.rates(shape)
        replicas.append(
            ReplicaPlan(
                name=f"r{k}",
                tp=shape.tp,
                pp=shape.pp,
                gpus=tuple(g for s in stages for g in s.gpus),
                stages=tuple(stages),
                capacity=caps,
            )
        )
        row = []
        for j in range(len(demand)):
            if served[j] > 0:
                row.append(per_replica[k][j] / served[j])
            else:  # no planned traffic: route in proportion to capacity
                total = sum(table.rates(s)[j] for s, _ in placed)
                row.append(caps[j] / total if total > 0 else 0.0)
        shares.append(tuple(row))
    unservable = tuple(
        c.name
        for j, c in enumerate(problem.classes)
        if not any(table.rates(s)[j] > 0 for s, _ in placed)
    )
    return Deployment(
        model=problem.profile.model.name,
        device=problem.profile.device,
        profile_source=problem.profile.source,
        method=method,
        classes=tuple(c.name for c in problem.classes),
        demand=demand,
        replicas=tuple(replicas),
        shares=tuple(shares),
        utilization=tuple(utilization),
        scale=evaluation.scale,
        objective=evaluation.scale * sum(demand),
        unservable=unservable,
        stats=stats,
    )
