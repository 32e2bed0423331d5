"""OServe Table 1's baseline and load, varied: why our speedups sit below the paper's.

`oserve.table1_rows` divides by the best homogeneous layout for each mix, at 0.7 of its
sustainable rate; the paper divides by "vLLM (static)", one configuration for the whole
run, at an unstated load. `sensitivity` runs the same mixes at `LOADS` against both:
`best_homogeneous` (as `table1_rows`), `static_dp8_tp2` / `static_dp2_tp8` (eight `tp2` or
two `tp8` replicas at every mix, the paper's vLLM deployments, least-outstanding routing;
null with the reason when the model finds no routing that sustains the rate), and the
heterogeneous layout with its routing, all on the same arrivals. Input: the analytic
Llama-2-70B profile, the quadrant classes, the planner's SLO. Output: rows for `tessera
bench sim --parts oserve_table1_sensitivity`; called by `tessera.sim.bench`. Every figure
is a simulation; results: docs/simulation.md, "Why our OServe speedups sit far below".
"""

from __future__ import annotations

import json
import sys
from typing import Any

from tessera.cost.capacity import RequestClass, Slo
from tessera.cost.profile import Profile
from tessera.planner import homogeneous, table1
from tessera.planner.latency import LatencyModel
from tessera.planner.shapes import Shape
from tessera.sim import engine
from tessera.sim.oserve import GPUS, NODES, _stats, build, mix_arrivals, router

LOADS = (0.7, 0.9)  # of the best homogeneous layout's sustainable rate at each mix
QUICK_LEVELS = ("S1", "S3", "S5")  # --quick: three of Table 1's five mixes
# the paper's vLLM deployments at its spans P1 (DP=8, TP=2) and P6 (DP=2, TP=8)
STATIC = (("static_dp8_tp2", Shape(2, 1, 1)), ("static_dp2_tp8", Shape(8, 1, 1)))


def sensitivity(
    profile: Profile, base: tuple[RequestClass, ...], slo: Slo, quick: bool
) -> list[dict[str, Any]]:
    """S1-S5 (quick: S1, S3, S5, shorter runs) at each load of `LOADS`: P99 of the
    heterogeneous layout and of the baselines, and the speedups over each (module
    docstring)."""
    span, warm = (150.0, 30.0) if quick else (420.0, 60.0)
    rows = []
    for load in LOADS:
        for level, shares, paper_cv, paper_speedup in table1.LEVELS:
            if quick and level not in QUICK_LEVELS:
                continue
            problem, table = table1.mix_problem(
                profile, table1.mixed(base, shares), slo, NODES, GPUS, quick=True
            )
            rate = load * table1.sustainable_rps(problem, table)
            demand = tuple(rate * w / sum(shares) for w in shares)
            pick = table1.choose(problem, table, demand)
            arr = mix_arrivals(base, [(span, shares)], rate)
            runs: list[tuple[str, Any, bool]] = [
                ("heterogeneous", pick.hetero, True),
                ("best_homogeneous", pick.homo, False),
            ]
            for name, shape in STATIC:
                static = homogeneous.replicate(table, shape)
                rep = LatencyModel(problem, table).best_routing(
                    (shape,), (static.replicas(),), demand, False
                )
                runs.append((name, (static, rep), False))
            p99: dict[str, float | None] = {}
            label: dict[str, str] = {}
            for name, which, routed in runs:
                try:
                    built = build(pick, which, "")
                except ValueError as exc:  # the model finds no routing sustaining the rate
                    p99[name], label[name] = None, str(exc)
                    continue
                res = engine.Engine(
                    built.replicas, router(base, built.shares if routed else None)
                ).run(arr, until=span)
                p99[name] = _stats(res, (warm, span))["p99_latency_s"]
                label[name] = built.label
            het = p99["heterogeneous"] or float("nan")
            row = {
                "label": "simulation",
                "level": level,
                "load": load,
                "span_s": span,
                "cv": round(table1.cv(shares), 4),
                "paper_cv": paper_cv,
                "total_rps": round(rate, 3),
                "p99_latency_s": p99,
                "layouts": label,
                "speedup": {
                    name: None if v is None else round(v / het, 3)
                    for name, v in p99.items()
                    if name != "heterogeneous"
                },
                "paper_speedup": paper_speedup,
            }
            sys.stderr.write(json.dumps(row) + "\n")  # a long run: each row as it is done
            rows.append(row)
    return rows
