"""Model output beside Proof 2: the predictive loop on the planner's GPU candidates over the
same shifting mix (`tessera bench adaptive` → `model_output`; no server, nothing measured).

The cost model shows what 2 shared CPU cores cannot (a layout trading one class against
another): two k-means classes of the shared trace, llama-2-13b on one node of 4 H100s (analytic
profile), the candidates of `policies.switching_planner`. Spans keep the bench's phases of
long-class shares at ``LOAD`` times the best layout's sustainable rate, arrivals drawn Poisson
(seeded) per ``SPAN_S`` span. Static layouts are priced at each span's true demand; the loop
(`switching_step.step`, active, the bench's `--min-gain`) sees only drawn counts and pays
``1 + disruption * switch_s / span`` in a span where it switches. Reported per policy: the
mean modelled P99 over spans (infinite when a layout cannot serve a span),
``p99_latency_ratio`` (best static / loop) and ``oracle_p99_latency_ratio`` (best static / the
best layout per span, switched for free: the most switching could gain).
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path
from typing import Any

from tessera import model_facts
from tessera.cost import analytic, model_shape
from tessera.cost.capacity import RequestClass, Slo
from tessera.planner import capacity_table
from tessera.planner.evaluate import Evaluator
from tessera.planner.problem import PlanningProblem, PoolNode
from tessera.policies.switching import gain as switching
from tessera.policies.switching import planner as switching_planner
from tessera.policies.switching import step as switching_step

ROOT = Path(__file__).resolve().parents[3]
MODEL = "llama-2-13b"
GPUS = 4
LOAD = 0.7
SPAN_S = 60.0


def _classes(args: argparse.Namespace) -> tuple[RequestClass, ...]:
    from tessera.workload import classes, traces

    fitted = classes.fit_classes(traces.read_azure_csv(args.trace), k=2, seed=args.seed)
    order = sorted(range(2), key=lambda c: fitted.centroids[c].input_tokens)
    return tuple(
        RequestClass(
            name,
            max(1, round(fitted.centroids[k].input_tokens)),
            max(1, round(fitted.centroids[k].output_tokens)),
        )
        for name, k in zip(("short", "long"), order, strict=True)
    )


def run(args: argparse.Namespace, shares: list[float]) -> dict[str, Any]:
    """The model-output comparison (module docstring)."""
    config = model_facts.read_config(ROOT / "examples/models" / MODEL)
    profile = analytic.analytic_profile(model_shape.from_hf_config(config, MODEL), "h100-80gb")
    base = _classes(args)
    pool = (PoolNode("n0", tuple(range(GPUS))),)
    slo = Slo(ttft_s=2.0, tpot_s=0.1)
    problem = PlanningProblem(profile, pool, 80 * 2**30, profile.comm, base, slo)
    table = capacity_table.build_table(problem)
    planned = switching_planner.candidates(problem, table)
    names = list(planned.deployments)

    def sustainable(share: float) -> float:
        mix = (1.0 - share, share)
        evaluator = Evaluator(table, mix)
        return max(evaluator(layout).scale for layout in _layouts(table)) * sum(mix)

    rates = {s: LOAD * sustainable(s) for s in set(shares)}
    rng = random.Random(args.seed)
    truth = [(rates[s] * (1 - s), rates[s] * s) for s in shares]
    counts = [[_poisson(rng, d * SPAN_S) for d in demand] for demand in truth]
    static = {n: sum(planned.price(n, d) for d in truth) / len(truth) for n in names}
    best = min(static, key=lambda n: static[n])
    cfg = switching.SwitchingConfig(True, "active", SPAN_S, args.min_gain)
    state, current = (
        switching.HysteresisState(),
        min(names, key=lambda n: planned.price(n, truth[0])),
    )
    start, per_span, switches, chosen = current, [], 0, []
    for k, demand in enumerate(truth):
        factor = 1.0
        if k:
            s = switching_step.step(
                cfg, state, counts[:k], current, names, planned.price, planned.switch_seconds
            )
            state = s.state
            if s.decision.action == switching.SWITCH:
                factor += cfg.disruption * s.decision.switch_s / SPAN_S
                current = s.decision.candidate
                switches += 1
        chosen.append(current)
        per_span.append(planned.price(current, demand) * factor)
    loop = sum(per_span) / len(per_span)
    oracle = sum(min(planned.price(n, d) for n in names) for d in truth) / len(truth)
    return {
        "label": "model output (analytic cost model + queueing), not measured",
        "setup": f"{MODEL} on 1x{GPUS} h100-80gb, {len(names)} candidate layouts, "
        f"{SPAN_S:.0f} s spans, Poisson arrivals at {LOAD} x the best layout's sustainable "
        "rate of each span's mix",
        "rate_rps_by_share": {str(s): round(r, 3) for s, r in sorted(rates.items())},
        "classes": [
            {"name": c.name, "input_tokens": c.input_tokens, "output_tokens": c.output_tokens}
            for c in base
        ],
        "p99_latency_ratio": round(static[best] / loop, 4) if math.isfinite(loop) else 0.0,
        "oracle_p99_latency_ratio": round(static[best] / oracle, 4),
        "switches": switches,
        "best_static": best,
        "mean_p99_s": {
            "loop": round(loop, 4),
            **{n: None if math.isinf(v) else round(v, 4) for n, v in static.items()},
        },
        "start": start,
        "layout_by_span": chosen,
    }


def _layouts(table: capacity_table.CapacityTable) -> list[Any]:
    from tessera.planner import exhaustive

    return list(exhaustive.layouts(table))


def _poisson(rng: random.Random, mean: float) -> float:
    """A Poisson draw (inversion for small means, normal approximation for large)."""
    if mean > 50:
        return float(max(0, round(rng.gauss(mean, math.sqrt(mean)))))
    k, p, target = 0, math.exp(-mean), rng.random()
    acc = p
    while acc < target:
        k += 1
        p *= mean / k
        acc += p
    return float(k)
