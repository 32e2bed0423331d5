"""The routing LP of the latency model: each class's rate split over replica groups at
least queue-free latency, every group's utilization under a cap (scipy's HiGHS).

`capped_lp(demand, capacity_matrix, cost, cap)` returns [group][class] req/s or None when
no split fits under `cap`; `apply_split` turns a split (shares) into rates at a demand.
Called by `planner.latency.LatencyModel.best_routing` / `robust_routing`, once per cap.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize

from tessera.planner import assign


def apply_split(split: tuple[tuple[float, ...], ...], demand: tuple[float, ...]) -> assign.Matrix:
    """[group][class] req/s: each class's share of `split` times its rate in `demand`."""
    return tuple(tuple(w * d for w, d in zip(row, demand, strict=True)) for row in split)


def capped_lp(
    demand: tuple[float, ...],
    capacity_matrix: assign.Matrix,
    cost: list[list[float]],
    cap: float,
) -> assign.Matrix | None:
    """min sum x*cost s.t. every class served, every group's utilization <= cap."""
    groups, classes = len(capacity_matrix), len(demand)
    n = groups * classes
    c = np.zeros(n)
    bounds = []
    for g in range(groups):
        for j in range(classes):
            ok = capacity_matrix[g][j] > 0 and math.isfinite(cost[g][j])
            c[g * classes + j] = cost[g][j] if ok else 0.0
            bounds.append((0.0, None if ok else 0.0))
    a_ub = np.zeros((groups, n))
    for g in range(groups):
        for j in range(classes):
            if capacity_matrix[g][j] > 0:
                a_ub[g, g * classes + j] = 1.0 / capacity_matrix[g][j]
    a_eq = np.zeros((classes, n))
    for g in range(groups):
        for j in range(classes):
            a_eq[j, g * classes + j] = 1.0
    res = optimize.linprog(
        c,
        A_ub=a_ub,
        b_ub=np.full(groups, cap),
        A_eq=a_eq,
        b_eq=np.asarray(demand),
        bounds=bounds,
        method="highs",
    )
    if res.status != 0:
        return None
    x = np.maximum(np.asarray(res.x), 0.0).reshape(groups, classes)
    return tuple(tuple(float(v) for v in row) for row in x)
