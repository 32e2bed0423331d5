"""Exact workload-class assignment: split each class's demand over replicas by LP.

Inputs: per-class demand ``d[j]`` (req/s), each replica's capacity ``cap[k][j]`` (req/s of
class j if it served only j), optional per-pair limits. Output: rates ``x[k][j] >= 0``
with each replica's utilization ``sum_j x[k][j] / cap[k][j] <= 1`` (it time-shares).
Objectives: ``throughput`` maximizes ``sum x`` with ``sum_k x[k][j] <= d[j]``;
``makespan`` serves all demand (``sum_k x[k][j] = d[j]``) minimizing the largest
utilization ``t`` (``1 / t``: how far the whole mix could grow). Solved by
``scipy.optimize.linprog(method="highs")``; the :class:`Certificate` carries the dual
objective rebuilt from HiGHS's marginals, the duality gap and the dual's stationarity and
sign residuals. Callers: ``tessera plan assign``, ``tessera.planner.evaluate`` (the
search's inner loop), tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import optimize, sparse

from tessera import fields

OBJECTIVES: tuple[str, ...] = ("throughput", "makespan")
TOLERANCE = 1e-7  # relative tolerance of the certificate checks

Matrix = tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class AssignmentProblem:
    """Demand per class and each replica's per-class capacity and limits."""

    demand: tuple[float, ...]  # [j] req/s offered
    capacity: Matrix  # [k][j] req/s of class j alone on replica k (0: cannot serve)
    limits: tuple[tuple[float | None, ...], ...] | None = None  # [k][j] cap on x, None: free

    def __post_init__(self) -> None:
        for j, value in enumerate(self.demand):
            if not (value >= 0 and math.isfinite(value)):
                raise fields.FieldError(f"demand[{j}]", "must be a finite number >= 0")
        for k, row in enumerate(self.capacity):
            if len(row) != len(self.demand):
                raise fields.FieldError(
                    f"capacity[{k}]", f"expected {len(self.demand)} values, got {len(row)}"
                )
            for j, value in enumerate(row):
                if not (value >= 0 and math.isfinite(value)):
                    raise fields.FieldError(f"capacity[{k}][{j}]", "must be a finite number >= 0")
        if self.limits is not None:
            if len(self.limits) != len(self.capacity):
                raise fields.FieldError("limits", "must have one row per replica")
            for k, lrow in enumerate(self.limits):
                if len(lrow) != len(self.demand):
                    raise fields.FieldError(
                        f"limits[{k}]", f"expected {len(self.demand)} values, got {len(lrow)}"
                    )
                for j, limit in enumerate(lrow):
                    if limit is not None and not limit >= 0:
                        raise fields.FieldError(f"limits[{k}][{j}]", "must be >= 0 or null")

    @property
    def replicas(self) -> int:
        """Number of replicas K."""
        return len(self.capacity)

    @property
    def classes(self) -> int:
        """Number of classes J."""
        return len(self.demand)

    def upper_bound(self, k: int, j: int) -> float:
        """Largest admissible x[k][j]: 0 without capacity, else the limit (or +inf)."""
        if self.capacity[k][j] <= 0:
            return 0.0
        limit = None if self.limits is None else self.limits[k][j]
        return math.inf if limit is None else float(limit)


@dataclass(frozen=True)
class Certificate:
    """Evidence that an LP solution is optimal: primal and dual objectives agree."""

    primal: float  # objective of x, in the problem's sense (served req/s or max utilization)
    dual: float  # dual objective rebuilt from the HiGHS marginals, same sense
    gap: float  # |primal - dual|
    dual_residual: float  # max |stationarity| and dual sign violation
    primal_violation: float  # max violation of any constraint or bound by x
    tolerance: float  # relative tolerance the checks use

    @property
    def optimal(self) -> bool:
        """True when gap, dual residual and primal violation are all within tolerance."""
        scale = 1.0 + abs(self.primal)
        return (
            self.gap <= self.tolerance * scale
            and self.dual_residual <= self.tolerance * scale
            and self.primal_violation <= self.tolerance * scale
        )


@dataclass(frozen=True)
class Assignment:
    """Optimal solution of an :class:`AssignmentProblem`."""

    objective: str  # "throughput" or "makespan"
    value: float  # served req/s (throughput) or largest utilization (makespan)
    rates: Matrix  # x[k][j] req/s of class j sent to replica k
    utilization: tuple[float, ...]  # [k] sum_j x[k][j] / cap[k][j]
    served: tuple[float, ...]  # [j] sum_k x[k][j]
    class_prices: tuple[float, ...]  # [j] d value / d demand[j]
    replica_prices: tuple[float, ...]  # [k] d value / d (capacity budget of replica k)
    certificate: Certificate

    def shares(self) -> Matrix:
        """[k][j] fraction of class j's served traffic routed to replica k (sums to 1)."""
        out = []
        for row in self.rates:
            out.append(
                tuple(
                    (x / self.served[j]) if self.served[j] > 0 else 0.0 for j, x in enumerate(row)
                )
            )
        return tuple(out)


class InfeasibleError(ValueError):
    """The makespan objective cannot serve some class's demand (capacity or limits)."""


def _load_matrix(problem: AssignmentProblem, extra_column: bool) -> sparse.csr_matrix:
    """Rows: per-replica load sum_j x/cap (minus t when ``extra_column``)."""
    k_count, j_count = problem.replicas, problem.classes
    rows, cols, vals = [], [], []
    for k in range(k_count):
        for j in range(j_count):
            cap = problem.capacity[k][j]
            if cap > 0:
                rows.append(k)
                cols.append(k * j_count + j)
                vals.append(1.0 / cap)
        if extra_column:
            rows.append(k)
            cols.append(k_count * j_count)
            vals.append(-1.0)
    width = k_count * j_count + (1 if extra_column else 0)
    return sparse.csr_matrix((vals, (rows, cols)), shape=(k_count, width))


def _demand_matrix(problem: AssignmentProblem, width: int) -> sparse.csr_matrix:
    """Rows: per-class served sum_k x[k][j]."""
    k_count, j_count = problem.replicas, problem.classes
    rows = [j for _ in range(k_count) for j in range(j_count)]
    cols = list(range(k_count * j_count))
    return sparse.csr_matrix(([1.0] * len(cols), (rows, cols)), shape=(j_count, width))


def _check_feasible(problem: AssignmentProblem) -> None:
    for j, demand in enumerate(problem.demand):
        reachable = sum(problem.upper_bound(k, j) for k in range(problem.replicas))
        if reachable < demand * (1 - 1e-12):
            raise InfeasibleError(
                f"classes[{j}].demand: {demand:g} req/s cannot be served; replicas admit at "
                f"most {reachable:g} req/s of this class (capacity or limits)"
            )


def solve(problem: AssignmentProblem, objective: str = "throughput") -> Assignment:
    """Solve the assignment LP exactly; raise :class:`InfeasibleError` for makespan when
    some class cannot be fully served."""
    if objective not in OBJECTIVES:
        raise fields.FieldError("objective", f"must be one of {', '.join(OBJECTIVES)}")
    makespan = objective == "makespan"
    if makespan:
        _check_feasible(problem)
    k_count, j_count = problem.replicas, problem.classes
    n_x = k_count * j_count
    width = n_x + (1 if makespan else 0)
    upper = [problem.upper_bound(k, j) for k in range(k_count) for j in range(j_count)]
    lower = [0.0] * n_x
    if makespan:
        upper.append(math.inf)
        lower.append(0.0)
    cost: npt.NDArray[np.float64] = np.zeros(width)
    load = _load_matrix(problem, makespan)
    served = _demand_matrix(problem, width)
    demand = np.asarray(problem.demand, dtype=np.float64)
    if makespan:
        cost[-1] = 1.0
        a_ub, b_ub = load, np.zeros(k_count)
        a_eq, b_eq = served, demand
    else:
        cost[:] = -1.0
        a_ub = sparse.vstack([served, load]).tocsr()
        b_ub = np.concatenate([demand, np.ones(k_count)])
        a_eq, b_eq = None, None
    if n_x == 0:
        return _empty(problem, objective)
    res = optimize.linprog(
        cost,
        A_ub=a_ub,
        b_ub=b_ub,
        A_eq=a_eq,
        b_eq=b_eq,
        bounds=list(zip(lower, upper, strict=True)),
        method="highs",
        # tighter than HiGHS's 1e-7 defaults: demands and limits may be small numbers
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed: {res.message}")
    x = np.asarray(res.x, dtype=np.float64)
    y_ub = np.asarray(res.ineqlin.marginals, dtype=np.float64)
    y_eq = np.asarray(res.eqlin.marginals, dtype=np.float64) if makespan else np.zeros(0)
    z_lo = np.asarray(res.lower.marginals, dtype=np.float64)
    z_up = np.asarray(res.upper.marginals, dtype=np.float64)
    lo = np.asarray(lower)
    up = np.asarray(upper)
    dual_min = (
        float(b_ub @ y_ub) + float(lo @ z_lo) + float(up[np.isfinite(up)] @ z_up[np.isfinite(up)])
    )
    stationarity = cost - a_ub.T @ y_ub - z_lo - z_up
    primal_violation = max(0.0, float(np.max(a_ub @ x - b_ub, initial=0.0)))
    if makespan:
        assert a_eq is not None and b_eq is not None
        dual_min += float(b_eq @ y_eq)
        stationarity = stationarity - a_eq.T @ y_eq
        primal_violation = max(
            primal_violation, float(np.max(np.abs(a_eq @ x - b_eq), initial=0.0))
        )
    primal_violation = max(
        primal_violation,
        float(np.max(lo - x, initial=0.0)),
        float(np.max(x - up, initial=0.0)),
    )
    sign = max(
        float(np.max(y_ub, initial=0.0)),  # <= rows of a min problem: marginals <= 0
        float(np.max(-z_lo, initial=0.0)),
        float(np.max(z_up, initial=0.0)),
        float(np.max(np.abs(z_up[~np.isfinite(up)]), initial=0.0)),
    )
    residual = max(float(np.max(np.abs(stationarity), initial=0.0)), sign)
    primal_min = float(cost @ x) + 0.0  # + 0.0 turns -0.0 into 0.0
    flip = 1.0 if makespan else -1.0  # report in the problem's own sense
    certificate = Certificate(
        primal=flip * primal_min + 0.0,
        dual=flip * dual_min + 0.0,
        gap=abs(primal_min - dual_min),
        dual_residual=residual,
        primal_violation=primal_violation,
        tolerance=TOLERANCE,
    )
    rates = x[:n_x].reshape(k_count, j_count)
    if makespan:
        class_prices = tuple(float(v) for v in y_eq)
        replica_prices = tuple(float(-v) for v in y_ub)
    else:
        class_prices = tuple(float(-v) for v in y_ub[:j_count])
        replica_prices = tuple(float(-v) for v in y_ub[j_count:])
    return Assignment(
        objective=objective,
        value=flip * primal_min + 0.0,
        rates=_matrix(rates),
        utilization=_utilization(problem, rates),
        served=tuple(float(v) for v in rates.sum(axis=0)),
        class_prices=class_prices,
        replica_prices=replica_prices,
        certificate=certificate,
    )


def _matrix(values: npt.NDArray[np.float64]) -> Matrix:
    return tuple(tuple(max(0.0, float(v)) for v in row) for row in values)


def _utilization(problem: AssignmentProblem, rates: npt.NDArray[np.float64]) -> tuple[float, ...]:
    out = []
    for k in range(problem.replicas):
        out.append(
            sum(float(rates[k][j]) / cap for j, cap in enumerate(problem.capacity[k]) if cap > 0)
        )
    return tuple(out)


def _empty(problem: AssignmentProblem, objective: str) -> Assignment:
    """No replica or no class: nothing to serve."""
    zeros = np.zeros((problem.replicas, problem.classes))
    return Assignment(
        objective=objective,
        value=0.0,
        rates=_matrix(zeros),
        utilization=tuple(0.0 for _ in range(problem.replicas)),
        served=tuple(0.0 for _ in range(problem.classes)),
        class_prices=tuple(0.0 for _ in range(problem.classes)),
        replica_prices=tuple(0.0 for _ in range(problem.replicas)),
        certificate=Certificate(0.0, 0.0, 0.0, 0.0, 0.0, TOLERANCE),
    )
