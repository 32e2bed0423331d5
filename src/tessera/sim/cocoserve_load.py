"""The CoCoServe load sweep (the simulation's `cocoserve_load` part): per rate and mode,
throughput and latency of two instances, layer replication (with and without Algorithm 2's
scale-down, `cocoserve_down`), and four instances.

Split from `cocoserve` so that `cocoserve_down`, which builds on that module's replica,
and the sweep that runs both import one way only (no import cycle). Called by
`sim/bench.py`; a simulation, not a measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tessera.cost.profile import Profile
from tessera.policies.scaling import module_scaling
from tessera.policies.scaling import speedup as sp
from tessera.policies.serving import batching
from tessera.sim import cocoserve_down, engine, report, setup
from tessera.sim.cocoserve import (
    GPU_MEMORY,
    HELPER_FREE_BYTES,
    IDLE,
    MODES,
    PLAN_BATCH,
    SLO,
    ReplicatedReplica,
    plan_replication,
    sampled,
)
from tessera.workload import traces


def load_rows(
    profile: Profile,
    trace: str,
    quick: bool,
    rates: Sequence[float] | None = None,
    span: float | None = None,
    warm: float | None = None,
) -> list[dict[str, Any]]:
    """The sweep: per rate and mode, throughput and latency (module docstring); `rates`,
    `span` and `warm` override the sweep's (tests)."""
    pool = traces.read_trace(trace)
    if rates is None:
        rates = (4.0, 12.0) if quick else (2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0)
    span_, warm_ = (90.0, 20.0) if quick else (240.0, 40.0)
    span = span_ if span is None else span
    warm = warm_ if warm is None else warm
    link = profile.comm.intra_node
    limits = batching.BatchLimits()
    mean_in = sum(r.input_tokens for r in pool) / len(pool)
    mean_out = sum(r.output_tokens for r in pool) / len(pool)
    context = int(mean_in + mean_out / 2)
    plan = plan_replication(profile, "gpu0", "gpu2", PLAN_BATCH, context)
    layers = sum(1 for r in plan.state.replicas if r)
    room = HELPER_FREE_BYTES - layers * profile.memory.layer_param_bytes

    rows: list[dict[str, Any]] = []
    for rate in rates:
        arr = sampled(rate, span, pool, seed=int(rate * 10))
        for mode in MODES:
            n = 4 if mode == "four_instances" else 2
            reps = setup.uniform(profile, profile.comm, n, 1, 1, 8, GPU_MEMORY, limits)
            controllers: list[cocoserve_down.ScaleDown] = []
            if mode in ("layer_replication", "replication_up_only"):
                reps = [
                    ReplicatedReplica(
                        r,
                        profile,
                        sp.Placement(f"gpu{i}", _renamed(plan.state, f"gpu{i + 2}")),
                        {f"gpu{i}": 1.0, f"gpu{i + 2}": IDLE},
                        link,
                        {f"gpu{i + 2}": room},
                    )
                    for i, r in enumerate(reps)
                ]
            if mode == "layer_replication":  # both directions: Algorithm 2 on violations
                controllers.append(
                    cocoserve_down.ScaleDown(
                        profile, SLO, {f"gpu{i + 2}": 0 for i in range(n)}, context
                    )
                )
            eng = engine.Engine(reps, setup.router_for(None, []), controllers, 1.0)
            res = eng.run(arr, until=span)
            s = report.summary(res, (warm, span))
            down = [r for c in controllers for r in c.records]
            rows.append(
                {
                    "label": "simulation",
                    "rate_rps": rate,
                    "mode": mode,
                    "gpus_serving": n,
                    "replicated_layers": layers if "replication" in mode else 0,
                    "throughput_tok_s": round(s["throughput_tok_s"], 1),
                    "p50_latency_s": round(s["e2e_p50_s"], 3),
                    "p99_latency_s": round(s["e2e_p99_s"], 3),
                    "p99_ttft_s": round(s["ttft_p99_s"], 3),
                    "requests": s["requests"],
                    "unfinished": s["unfinished"],
                    **({"scale_down": _down_summary(down)} if mode == "layer_replication" else {}),
                }
            )
    return rows


def _down_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Algorithm 2's decisions in one run: how often it ran, its phases and actions."""
    acted = [r for r in records if r["actions"]]
    count: dict[str, int] = {}
    for r in records:
        for a in r["actions"]:
            count[a] = count.get(a, 0) + 1
    return {
        "decisions": len(records),
        "over_threshold": sum(
            1 for r in records if r["violation_rate"] > module_scaling.DEFAULT_DOWN_VIOLATION_RATE
        ),
        "acted": len(acted),
        "actions": count,
        "sources": sorted({r["source"] for r in acted}),
        "first": acted[0] if acted else (records[0] if records else None),
    }


def _renamed(state: sp.Placement, helper: str) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(helper for _ in r) for r in state.replicas)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean throughput gain and latency cut of replication over two instances."""
    by = {(r["rate_rps"], r["mode"]): r for r in rows}
    gains, cuts = [], []
    for (rate, mode), r in by.items():
        if mode != "layer_replication":
            continue
        base = by[(rate, "two_instances")]
        if base["throughput_tok_s"]:
            gains.append(r["throughput_tok_s"] / base["throughput_tok_s"])
        if base["p50_latency_s"]:
            cuts.append(1 - r["p50_latency_s"] / base["p50_latency_s"])
    return {
        "label": "simulation",
        "throughput_gain_mean": round(sum(gains) / len(gains), 3) if gains else None,
        "throughput_gain_max": round(max(gains), 3) if gains else None,
        "p50_latency_reduction_mean": round(sum(cuts) / len(cuts), 3) if cuts else None,
        "paper": "CoCoServe Fig. 10 (2 instances vs HFT-2, A100): latency -14.2 % (low load) "
        "and -27.5 % (high load), throughput +16.9 % / +38.8 %; vs vLLM 1.16-1.48x "
        "throughput",
    }
