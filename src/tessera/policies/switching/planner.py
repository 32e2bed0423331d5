"""Switching candidates from the planner: layouts priced by the latency objective, switch
times from the greedy switch plan (pure).

For a GPU pool with a cost profile: the exhaustive enumeration's layouts (or a given
list), each materialized on the pool's GPUs (`planner.deployment.materialize`), named by
`Layout.label()`; ``price(name, demand)`` is the modelled P99 request latency with the best
routing at a per-class demand (order of ``problem.classes``; `planner.latency`, queueing
included; ``inf`` when it cannot serve); ``switch_seconds(a, b)`` is the greedy switch
plan's time (`switching.switch_plan.plan`, the profile's links, ``storage_bytes_per_s``).
`candidates` keeps at most ``max_candidates`` (`cap`, default `MAX_CANDIDATES`), taken
round-robin from the throughput rankings at the expected mix and at each single-class mix.
`PlannedCandidates` is reusable across spans; `extended` adds per-span deployments without
caching their switch times. Model output. Callers: the switching loop's candidate source,
`switching.candidates`, tests. docs/switching.md, "The loop".
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
from tessera.policies import device_links, placement
from tessera.policies.switching import switch_plan

STORAGE_BYTES_PER_S = 2e9  # network storage read bandwidth assumed for reloads
MAX_CANDIDATES = 32  # default cap on the planner layouts priced each span


@dataclass
class PlannedCandidates:
    """Named planner deployments with their pricing and switch times (module docstring)."""

    problem: PlanningProblem
    table: CapacityTable
    deployments: dict[str, Deployment]
    storage_bytes_per_s: float = STORAGE_BYTES_PER_S
    _model: LatencyModel | None = None
    _switch: dict[tuple[str, str], float] = field(default_factory=dict)
    _volatile: frozenset[str] = frozenset()  # names whose switch times are not kept

    def extended(self, extra: dict[str, Deployment]) -> PlannedCandidates:
        """These candidates plus ``extra`` (per-span ones), sharing the latency model and
        the switch times between the cached candidates."""
        if self._model is None:
            self._model = LatencyModel(self.problem, self.table)
        return PlannedCandidates(
            self.problem,
            self.table,
            {**self.deployments, **extra},
            self.storage_bytes_per_s,
            self._model,
            self._switch,
            self._volatile | frozenset(extra),
        )

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
        if key in self._switch:
            return self._switch[key]
        links = device_links.from_comm(self.problem.comm, self.storage_bytes_per_s)
        seconds = switch_plan.plan(
            placement.from_deployment(self.deployments[source]),
            placement.from_deployment(self.deployments[target]),
            placement.model_bytes(self.problem.profile),
            links,
        ).seconds
        if source not in self._volatile and target not in self._volatile:
            self._switch[key] = seconds
        return seconds


def cap(
    problem: PlanningProblem, table: CapacityTable, layouts: Sequence[Layout], limit: int
) -> list[Layout]:
    """At most ``limit`` of ``layouts`` by the module docstring's rule (all when fewer)."""
    if limit < 1:
        raise ValueError(f"max_candidates must be >= 1, got {limit}")
    if len(layouts) <= limit:
        return list(layouts)
    n = len(problem.classes)
    mixes = [problem.demand] + [tuple(float(i == k) for i in range(n)) for k in range(n)]
    rankings = []
    for mix in dict.fromkeys(mixes):  # a one-class problem's mixes coincide
        evaluator = Evaluator(table, mix)
        scores = [evaluator(layout).score for layout in layouts]
        rankings.append(sorted(range(len(layouts)), key=lambda i: -scores[i]))
    chosen: dict[int, None] = {}
    for rank in range(len(layouts)):
        for ranking in rankings:
            if len(chosen) == limit:
                return [layouts[i] for i in chosen]
            chosen.setdefault(ranking[rank], None)
    return [layouts[i] for i in chosen]


def candidates(
    problem: PlanningProblem,
    table: CapacityTable,
    layouts: Sequence[Layout] | None = None,
    storage_bytes_per_s: float = STORAGE_BYTES_PER_S,
    max_candidates: int = MAX_CANDIDATES,
) -> PlannedCandidates:
    """The layouts (default: the exhaustive enumeration), at most ``max_candidates`` of them
    (`cap`), placed on the pool and named."""
    every = list(exhaustive.layouts(table)) if layouts is None else list(layouts)
    chosen = cap(problem, table, every, max_candidates)
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
