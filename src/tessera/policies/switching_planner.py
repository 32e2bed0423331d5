"""Switching candidates from the planner: layouts priced by the latency objective, switch
times from the greedy switch plan (pure).

The predictive step (`policies.switching_step`) needs candidate deployments, a price at a
forecast demand and a switch time. For a GPU pool with a cost profile this module
supplies them from the planner's own pieces: the layouts of the exhaustive enumeration
(`planner.exhaustive.layouts`, or any given list), each materialized on the pool's GPUs
(`planner.deployment.materialize`), named by `Layout.label()`; ``price(name, demand)`` is
the modelled P99 request latency of that deployment with its best routing at the demand
(`planner.latency.LatencyModel.deployment`, queueing included; ``inf`` when it cannot
serve it); ``switch_seconds(a, b)`` the greedy switch plan's time between the two
placements (`policies.switch_plan.plan` over `placement.from_deployment`, the profile's
links and ``storage_bytes_per_s`` for reloads). Demand is per class in the order of
``problem.classes``. Every figure is model output. Callers: the switching loop's candidate
source (operator config) and tests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tessera.planner import exhaustive
from tessera.planner.capacity_table import CapacityTable
from tessera.planner.deployment import Deployment, materialize
from tessera.planner.evaluate import Evaluator
from tessera.planner.latency import LatencyModel
from tessera.planner.layout import Layout
from tessera.planner.problem import PlanningProblem
from tessera.policies import device_links, placement, switch_plan

STORAGE_BYTES_PER_S = 2e9  # network storage read bandwidth assumed for reloads


@dataclass
class PlannedCandidates:
    """Named planner deployments with their pricing and switch times (module docstring)."""

    problem: PlanningProblem
    table: CapacityTable
    deployments: dict[str, Deployment]
    storage_bytes_per_s: float = STORAGE_BYTES_PER_S
    _model: LatencyModel | None = None
    _switch: dict[tuple[str, str], float] = field(default_factory=dict)

    def price(self, name: str, demand: tuple[float, ...]) -> float:
        """Modelled P99 request latency of deployment ``name`` at ``demand`` (req/s)."""
        if len(demand) != len(self.problem.classes):
            raise ValueError(
                f"demand has {len(demand)} classes, the problem {len(self.problem.classes)}"
            )
        if self._model is None:
            self._model = LatencyModel(self.problem, self.table)
        value = self._model.deployment(self.deployments[name], demand).p99_latency_s
        return value if value > 0 else math.inf

    def switch_seconds(self, source: str, target: str) -> float:
        """The greedy switch plan's time from ``source`` to ``target``."""
        key = (source, target)
        if key not in self._switch:
            links = device_links.from_comm(self.problem.comm, self.storage_bytes_per_s)
            plan = switch_plan.plan(
                placement.from_deployment(self.deployments[source]),
                placement.from_deployment(self.deployments[target]),
                placement.model_bytes(self.problem.profile),
                links,
            )
            self._switch[key] = plan.seconds
        return self._switch[key]


def candidates(
    problem: PlanningProblem,
    table: CapacityTable,
    layouts: Sequence[Layout] | None = None,
    storage_bytes_per_s: float = STORAGE_BYTES_PER_S,
) -> PlannedCandidates:
    """Every layout (default: the exhaustive enumeration) placed on the pool and named."""
    chosen = list(exhaustive.layouts(table)) if layouts is None else list(layouts)
    if not chosen:
        raise ValueError("no layout to switch between")
    evaluator = Evaluator(table, problem.demand)
    deployments: dict[str, Deployment] = {}
    for layout in chosen:
        dep = materialize(problem, table, layout, evaluator(layout), "latency")
        if dep.replicas:
            deployments.setdefault(layout.label(), dep)
    if not deployments:
        raise ValueError("no layout could be placed on the pool")
    return PlannedCandidates(problem, table, deployments, storage_bytes_per_s)
