"""Max-flow form of the assignment, solved by preflow-push, to cross-check the LP.

Network: source -> class j (capacity ``d[j]``) -> replica k (``limit[k][j]``, an edge only
where ``cap[k][j] > 0``) -> sink (``c[k]``); a flow's value is the served rate. The LP's
``sum_j x[k][j] / cap[k][j] <= 1`` is not a flow constraint, but it is sandwiched: with
``c[k] = max_j cap[k][j]`` the max flow is an upper bound on the LP optimum, with
``c[k] = min_j cap[k][j]`` (over the replica's edges) a lower bound. They coincide, and the
flow form is exact, when each replica's capacity is the same for every class it serves
(e.g. one class per replica). Capacities are scaled to integers (floored for the lower
bound, ceiled for the upper), so both bounds stay valid on exact arithmetic. Callers:
tests and ``tessera.planner.assign_input`` (``flow_check`` of ``tessera plan assign``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx
from networkx.algorithms.flow import preflow_push

from tessera.planner.assign import AssignmentProblem

_SOURCE = "source"
_SINK = "sink"


@dataclass(frozen=True)
class FlowBounds:
    """Max-flow bounds on the throughput LP's optimum."""

    lower: float  # max flow with each replica capped at its smallest class capacity
    upper: float  # max flow with each replica capped at its largest class capacity
    exact: bool  # the flow form equals the LP (capacities uniform per replica)


def _edge_caps(problem: AssignmentProblem, k: int) -> list[float]:
    caps = []
    for j in range(problem.classes):
        if problem.upper_bound(k, j) > 0:
            caps.append(problem.capacity[k][j])
    return caps


def is_exact(problem: AssignmentProblem) -> bool:
    """True when every replica's usable class capacities are all equal."""
    for k in range(problem.replicas):
        caps = _edge_caps(problem, k)
        if caps and max(caps) - min(caps) > 1e-12 * max(caps):
            return False
    return True


def _scale(problem: AssignmentProblem) -> float:
    """Integer units per req/s: the largest finite figure maps to about 1e9 units."""
    figures = [d for d in problem.demand if d > 0]
    figures += [c for row in problem.capacity for c in row if c > 0]
    largest = max(figures, default=1.0)
    return 1e9 / largest


def max_flow(problem: AssignmentProblem, replica_caps: list[float], round_up: bool) -> float:
    """Max flow (req/s) with replica k -> sink capped at ``replica_caps[k]``."""
    scale = _scale(problem)
    rnd = math.ceil if round_up else math.floor

    def units(value: float) -> int:
        return int(rnd(value * scale))

    graph = nx.DiGraph()
    graph.add_node(_SOURCE)
    graph.add_node(_SINK)
    for j, demand in enumerate(problem.demand):
        graph.add_edge(_SOURCE, ("class", j), capacity=units(demand))
    for k in range(problem.replicas):
        graph.add_edge(("replica", k), _SINK, capacity=units(replica_caps[k]))
        for j in range(problem.classes):
            bound = problem.upper_bound(k, j)
            if bound <= 0:
                continue
            if math.isinf(bound):
                graph.add_edge(("class", j), ("replica", k))  # no capacity: unbounded
            else:
                graph.add_edge(("class", j), ("replica", k), capacity=units(bound))
    value = nx.maximum_flow_value(graph, _SOURCE, _SINK, flow_func=preflow_push)
    return float(value) / scale


def flow_bounds(problem: AssignmentProblem) -> FlowBounds:
    """Return the preflow-push lower and upper bounds on the throughput optimum."""
    upper_caps, lower_caps = [], []
    for k in range(problem.replicas):
        caps = _edge_caps(problem, k)
        upper_caps.append(max(caps, default=0.0))
        lower_caps.append(min(caps, default=0.0))
    return FlowBounds(
        lower=max_flow(problem, lower_caps, round_up=False),
        upper=max_flow(problem, upper_caps, round_up=True),
        exact=is_exact(problem),
    )
