"""Assignment LP: brute-force agreement, constraints, certificate, flow cross-check."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.planner import assign, assign_flow
from tessera.planner.assign import AssignmentProblem

TOL = 1e-6

capacities = st.one_of(st.just(0.0), st.floats(min_value=0.5, max_value=20.0))
demands = st.one_of(st.just(0.0), st.floats(min_value=0.01, max_value=15.0))
limits = st.one_of(st.none(), st.just(0.0), st.floats(min_value=1e-3, max_value=10.0))


@st.composite
def problems(
    draw: st.DrawFn, replicas: int = 2, classes: int = 2, with_limits: bool = True
) -> AssignmentProblem:
    demand = tuple(draw(demands) for _ in range(classes))
    cap = tuple(tuple(draw(capacities) for _ in range(classes)) for _ in range(replicas))
    lim = None
    if with_limits and draw(st.booleans()):
        lim = tuple(tuple(draw(limits) for _ in range(classes)) for _ in range(replicas))
    return AssignmentProblem(demand, cap, lim)


Row = tuple[np.ndarray, float]  # a.x <= b or a.x == b


def _constraints(p: AssignmentProblem, makespan: bool) -> tuple[list[Row], list[Row], int]:
    """Inequalities a.x <= b and equalities over x (flattened k-major) and t (last)."""
    k_n, j_n = p.replicas, p.classes
    n = k_n * j_n + (1 if makespan else 0)
    ineq: list[Row] = []
    eq: list[Row] = []
    for j in range(j_n):
        row = np.zeros(n)
        for k in range(k_n):
            row[k * j_n + j] = 1.0
        (eq if makespan else ineq).append((row, p.demand[j]))
    for k in range(k_n):
        row = np.zeros(n)
        for j in range(j_n):
            if p.capacity[k][j] > 0:
                row[k * j_n + j] = 1.0 / p.capacity[k][j]
        if makespan:
            row[-1] = -1.0
        ineq.append((row, 0.0 if makespan else 1.0))
    for i in range(n):
        row = np.zeros(n)
        row[i] = -1.0
        ineq.append((row, 0.0))
    for k in range(k_n):
        for j in range(j_n):
            ub = p.upper_bound(k, j)
            if math.isfinite(ub):
                row = np.zeros(n)
                row[k * j_n + j] = 1.0
                ineq.append((row, ub))
    return ineq, eq, n


def brute_force(p: AssignmentProblem, makespan: bool) -> float | None:
    """Optimum by enumerating every vertex of the feasible polyhedron."""
    ineq, eq, n = _constraints(p, makespan)
    best: float | None = None
    for chosen in itertools.combinations(range(len(ineq)), n - len(eq)):
        rows = [ineq[i] for i in chosen] + eq
        a = np.array([r for r, _ in rows])
        b = np.array([v for _, v in rows])
        if abs(np.linalg.det(a)) < 1e-12:
            continue
        x = np.linalg.solve(a, b)
        if any(r @ x > v + 1e-9 * (1 + abs(v)) for r, v in ineq):
            continue
        if any(abs(r @ x - v) > 1e-10 * (1 + abs(v)) for r, v in eq):
            continue
        value = x[-1] if makespan else float(np.sum(x))
        if best is None or (value < best if makespan else value > best):
            best = float(value)
    return best


def check_feasible(p: AssignmentProblem, r: assign.Assignment) -> None:
    for k in range(p.replicas):
        for j in range(p.classes):
            x = r.rates[k][j]
            assert x >= -TOL
            assert x <= p.upper_bound(k, j) + TOL
        assert r.utilization[k] <= (1.0 if r.objective == "throughput" else r.value) + TOL
    for j in range(p.classes):
        if r.objective == "throughput":
            assert r.served[j] <= p.demand[j] + TOL
        else:
            assert r.served[j] == pytest.approx(p.demand[j], abs=TOL)


@settings(max_examples=80, deadline=None)
@given(problems())
def test_throughput_lp_matches_vertex_enumeration(p: AssignmentProblem) -> None:
    result = assign.solve(p, "throughput")
    check_feasible(p, result)
    assert result.certificate.optimal
    assert result.value == pytest.approx(brute_force(p, False), rel=1e-6, abs=1e-7)


@settings(max_examples=80, deadline=None)
@given(problems())
def test_makespan_lp_matches_vertex_enumeration(p: AssignmentProblem) -> None:
    try:
        result = assign.solve(p, "makespan")
    except assign.InfeasibleError:
        assert brute_force(p, True) is None
        return
    check_feasible(p, result)
    assert result.certificate.optimal
    assert result.value == pytest.approx(brute_force(p, True), rel=1e-6, abs=1e-7)


@settings(max_examples=60, deadline=None)
@given(problems(replicas=5, classes=4))
def test_certificate_agrees_and_constraints_hold_on_larger_instances(p: AssignmentProblem) -> None:
    for objective in assign.OBJECTIVES:
        try:
            r = assign.solve(p, objective)
        except assign.InfeasibleError:
            continue
        cert = r.certificate
        assert cert.optimal
        assert abs(cert.primal - cert.dual) <= 1e-7 * (1 + abs(cert.primal))
        assert cert.primal == pytest.approx(r.value)
        check_feasible(p, r)
        served = [j for j in range(p.classes) if r.served[j] > 0]
        for j in served:
            assert sum(row[j] for row in r.shares()) == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(problems(replicas=4, classes=3))
def test_flow_bounds_sandwich_the_lp(p: AssignmentProblem) -> None:
    value = assign.solve(p, "throughput").value
    bounds = assign_flow.flow_bounds(p)
    slack = 1e-6 * (1 + value)
    assert bounds.lower <= value + slack
    assert value <= bounds.upper + slack


@st.composite
def uniform_problems(draw: st.DrawFn) -> AssignmentProblem:
    """Each replica serves its classes at one speed (or a single class): flow is exact."""
    classes = 3
    demand = tuple(draw(demands) for _ in range(classes))
    rows = []
    for _ in range(4):
        speed = draw(st.floats(min_value=0.5, max_value=20.0))
        mask = [draw(st.booleans()) for _ in range(classes)]
        rows.append(tuple(speed if m else 0.0 for m in mask))
    return AssignmentProblem(demand, tuple(rows))


@settings(max_examples=60, deadline=None)
@given(uniform_problems())
def test_preflow_push_equals_lp_where_flow_form_is_exact(p: AssignmentProblem) -> None:
    bounds = assign_flow.flow_bounds(p)
    assert bounds.exact
    value = assign.solve(p, "throughput").value
    assert bounds.lower == pytest.approx(value, rel=1e-6, abs=1e-6)
    assert bounds.upper == pytest.approx(value, rel=1e-6, abs=1e-6)


def test_single_class_per_replica_is_exact_and_known() -> None:
    p = AssignmentProblem((40.0, 10.0, 3.0), ((30.0, 0, 0), (5.0, 5.0, 0), (0, 0, 7.0)))
    assert assign_flow.is_exact(p)
    assert assign.solve(p).value == pytest.approx(38.0)
    assert assign_flow.flow_bounds(p).lower == pytest.approx(38.0)


def test_makespan_prices_and_scale() -> None:
    p = AssignmentProblem((4.0, 1.0), ((30.0, 2.0), (50.0, 5.0)))
    r = assign.solve(p, "makespan")
    assert r.certificate.optimal
    assert max(r.utilization) == pytest.approx(r.value)
    assert sum(r.replica_prices) == pytest.approx(1.0)  # dual weights of the max
    doubled = assign.solve(AssignmentProblem((8.0, 2.0), p.capacity), "makespan")
    assert doubled.value == pytest.approx(2 * r.value)


def test_makespan_infeasible_names_the_class() -> None:
    p = AssignmentProblem((1.0, 2.0), ((5.0, 0.0), (5.0, 3.0)), ((None, None), (None, 1.5)))
    with pytest.raises(assign.InfeasibleError, match=r"classes\[1\]\.demand"):
        assign.solve(p, "makespan")


def test_validation_names_fields() -> None:
    with pytest.raises(ValueError, match=r"capacity\[1\]\[0\]"):
        AssignmentProblem((1.0,), ((1.0,), (-1.0,)))
    with pytest.raises(ValueError, match=r"capacity\[0\]: expected 2 values"):
        AssignmentProblem((1.0, 1.0), ((1.0,),))
    with pytest.raises(ValueError, match="objective"):
        assign.solve(AssignmentProblem((1.0,), ((1.0,),)), "latency")
