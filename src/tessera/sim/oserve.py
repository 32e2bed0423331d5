"""OServe through the simulator: Table 1 (heterogeneous + assignment vs the best homogeneous
layout per mix as the class mix skews), and the pieces the other OServe parts build on.

Input: the analytic Llama-2-70B profile on 2 x 8 H100s, the four quadrant classes of the
shared Azure trace and the paper's S1-S5 mixes (`tessera.planner.table1`). Output: the
`oserve_table1` rows of `tessera bench sim` (`table1_rows`), at `LOAD` of the best
homogeneous layout's sustainable rate. Layouts and routing are imported, not
re-implemented: `planner.table1.choose`, GPUs by `planner.deployment.materialize`
(`build`), the gateway's `policies.routing.Router` with the routing's class shares
(`router`). Callers: `tessera.sim.bench`, and `oserve_table1`, `oserve_table2`,
`oserve_switcher`, `oserve_calibrate` (which import `build`, `router`, `mix_arrivals`).
Every figure is a simulation; docs/simulation.md, "OServe Table 1".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tessera.cost.capacity import RequestClass, Slo
from tessera.cost.profile import Profile
from tessera.planner import deployment, table1
from tessera.planner.evaluate import Evaluator
from tessera.planner.latency_report import LatencyReport
from tessera.planner.layout import Layout
from tessera.planner.shapes import Shape
from tessera.policies import placement
from tessera.policies.routing.shares import Router, centroid_class_router
from tessera.sim import arrivals, engine, report, setup
from tessera.sim.replica import SimReplica

NODES, GPUS = 2, 8
LOAD = 0.7  # of the best homogeneous layout's sustainable rate (as table1)
# OServe Table 2: (trace, levels in order, paper's CV, paper's average speedup)
TRACES: tuple[tuple[str, tuple[str, ...], float, float], ...] = (
    ("T1", ("S1", "S2", "S1"), 0.052, 1.23),
    ("T2", ("S1", "S3", "S2"), 0.172, 1.48),
    ("T3", ("S2", "S4", "S3"), 0.263, 1.82),
    ("T4", ("S1", "S4", "S5"), 0.348, 1.98),
)


@dataclass
class Built:
    """A planned layout as simulated replicas, their routing and their placement."""

    replicas: list[SimReplica]
    shares: dict[str, dict[str, float]]  # class -> replica -> req/s
    placed: tuple[placement.ReplicaPlacement, ...]
    label: str
    shape_of: dict[str, Shape]  # replica name -> its planner shape
    prefix: str = ""  # sim replica name = prefix + the deployment's replica name


def build(
    pick: table1.Choice,
    which: tuple[Layout, LatencyReport],
    prefix: str,
) -> Built:
    """Simulated replicas of a layout placed by the planner, with its routing's shares
    (replicas of a group split the group's rate of each class evenly)."""
    layout, rep = which
    if not rep.groups:
        raise ValueError(f"{layout.label()}: no feasible routing at this demand")
    problem, table = pick.problem, pick.table
    dep = deployment.materialize(
        problem, table, layout, Evaluator(table, problem.demand)(layout), "latency"
    )
    gpu_mem = table1.GPU_MEMORY
    by_shape: dict[Shape, list[Any]] = {}
    for r in dep.replicas:
        span = len({node for node, _ in r.gpus})
        by_shape.setdefault(Shape(r.tp, r.pp, span), []).append(r)
    sims = setup.from_plan(dep, problem.profile, problem.comm, gpu_mem)
    sim_of = {r.name: s for r, s in zip(dep.replicas, sims, strict=True)}
    names = [c.name for c in problem.classes]
    shares: dict[str, dict[str, float]] = {n: {} for n in names}
    out: list[SimReplica] = []
    shape_of: dict[str, Shape] = {}
    for (shape, n), row in zip(rep.groups, rep.rates, strict=True):
        members = by_shape[shape][:n]
        del by_shape[shape][:n]
        for r in members:
            sim = sim_of[r.name]
            sim.name = f"{prefix}{r.name}"
            shape_of[sim.name] = shape
            out.append(sim)
            for j, cls in enumerate(names):
                if row[j] > 0:
                    shares[cls][sim.name] = row[j] / n
    return Built(out, shares, placement.from_deployment(dep), layout.label(), shape_of, prefix)


def router(classes: Sequence[RequestClass], shares: dict[str, dict[str, float]] | None) -> Router:
    """The gateway's router; with shares, per-class weighted choice by centroid class."""
    r = Router(0)
    if shares:
        cents = {c.name: (float(c.input_tokens), float(c.output_tokens)) for c in classes}
        r.set_class_shares(shares, centroid_class_router(cents))
    return r


def mix_arrivals(
    classes: Sequence[RequestClass], phases: Sequence[tuple[float, Sequence[float]]], rate: float
) -> list[arrivals.Arrival]:
    """Poisson at `rate` over consecutive phases of (seconds, class shares); each request
    has its class's (median) lengths."""
    out: list[arrivals.Arrival] = []
    t0 = 0.0
    for k, (length, shares) in enumerate(phases):
        mix = [(w, c.input_tokens, c.output_tokens) for c, w in zip(classes, shares, strict=True)]
        out += [
            arrivals.Arrival(a.time + t0, a.prompt, a.output)
            for a in arrivals.poisson(rate, length, mix, seed=11 + k)
        ]
        t0 += length
    return out


def _stats(res: engine.SimResult, window: tuple[float, float]) -> dict[str, Any]:
    s = report.summary(res, window)
    return {
        "requests": s["requests"],
        "unfinished": s["unfinished"],
        "p99_latency_s": round(s["e2e_p99_s"], 3),
        "p50_latency_s": round(s["e2e_p50_s"], 3),
        "p99_ttft_s": round(s["ttft_p99_s"], 3),
        "p99_tpot_s": round(s["tpot_p99_s"], 4),
        "throughput_tok_s": round(s["throughput_tok_s"], 1),
        "preemptions": s["preemptions"],
    }


def table1_rows(
    profile: Profile, base: tuple[RequestClass, ...], slo: Slo, quick: bool
) -> list[dict[str, Any]]:
    """S1-S5 (quick: S1, S5): the planner's heterogeneous layout with its routing and
    the best homogeneous layout with least-outstanding routing, each simulated at
    LOAD x the homogeneous sustainable rate; P99 request latency over arrivals after a
    warm-up."""
    levels = (table1.LEVELS[0], table1.LEVELS[-1]) if quick else table1.LEVELS
    span, warm = (150.0, 30.0) if quick else (420.0, 60.0)
    rows = []
    for level, shares, paper_cv, paper_speedup in levels:
        problem, table = table1.mix_problem(
            profile, table1.mixed(base, shares), slo, NODES, GPUS, quick=True
        )
        rate = LOAD * table1.sustainable_rps(problem, table)
        demand = tuple(rate * w / sum(shares) for w in shares)
        pick = table1.choose(problem, table, demand)
        arr = mix_arrivals(base, [(span, shares)], rate)
        got: dict[str, dict[str, Any]] = {}
        for mode, which in (("heterogeneous", pick.hetero), ("homogeneous", pick.homo)):
            built = build(pick, which, "")
            shares_ = built.shares if mode == "heterogeneous" else None
            res = engine.Engine(built.replicas, router(base, shares_)).run(arr, until=span)
            got[mode] = {
                "layout": built.label,
                "dedicated": which[1].dedicated,
                "model_p99_latency_s": round(which[1].p99_latency_s, 3),
                **_stats(res, (warm, span)),
            }
        het, hom = got["heterogeneous"], got["homogeneous"]
        rows.append(
            {
                "level": level,
                "label": "simulation",
                "cv": round(table1.cv(shares), 4),
                "paper_cv": paper_cv,
                "total_rps": round(rate, 3),
                "speedup_sim": round(hom["p99_latency_s"] / het["p99_latency_s"], 3)
                if het["p99_latency_s"]
                else None,
                "speedup_model": round(hom["model_p99_latency_s"] / het["model_p99_latency_s"], 3),
                "paper_speedup": paper_speedup,
                "heterogeneous": het,
                "homogeneous": hom,
            }
        )
    return rows


def trace_cv(levels: Sequence[str]) -> float:
    """OServe Table 2's CV: per class, population std / mean of its share across the
    trace's spans, averaged over the classes."""
    mat = np.asarray([_shares(lv) for lv in levels], dtype=float)
    return float(np.mean(mat.std(axis=0) / mat.mean(axis=0)))


def _shares(level: str) -> tuple[float, ...]:
    return next(s for name, s, _, _ in table1.LEVELS if name == level)


def built_label(pick: table1.Choice) -> str:
    return pick.homo[0].label()
