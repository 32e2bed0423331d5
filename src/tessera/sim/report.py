"""Summary statistics of a simulation run (every figure is simulated, and says so).

Input: a `engine.SimResult`. Output: a JSON-ready dict (throughput, TTFT / end-to-end /
TPOT percentiles, preemptions, actions) and a per-window latency series for plots.
Called by the CLI, the bench and the plots.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tessera.sim.engine import Done, SimResult


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else 0.0


def summary(res: SimResult, window: tuple[float, float] | None = None) -> dict[str, Any]:
    """Throughput and latency of the requests that arrived in `window` (default: all)."""
    done: list[Done] = res.done
    if window is not None:
        done = [d for d in done if window[0] <= d.arrival < window[1]]
    ttft = [d.first - d.arrival for d in done]
    e2e = [d.finish - d.arrival for d in done]
    tpot = [(d.finish - d.first) / (d.output - 1) for d in done if d.output > 1]
    span = (max(d.finish for d in done) - min(d.arrival for d in done)) if done else 0.0
    tokens = sum(d.output for d in done)
    return {
        "simulated": True,
        "requests": len(done),
        "unfinished": res.unfinished,
        "throughput_rps": len(done) / span if span else 0.0,
        "throughput_tok_s": tokens / span if span else 0.0,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "e2e_p50_s": percentile(e2e, 50),
        "e2e_p95_s": percentile(e2e, 95),
        "e2e_p99_s": percentile(e2e, 99),
        "tpot_p50_s": percentile(tpot, 50),
        "tpot_p99_s": percentile(tpot, 99),
        "preemptions": res.preemptions,
        "steps": res.steps,
        "events": res.events,
        "simulated_seconds": res.sim_seconds,
        "actions": [{"time_s": round(t, 3), "action": a} for t, a in res.actions[:50]],
    }


def latency_series(res: SimResult, window_s: float) -> list[tuple[float, float, float]]:
    """(window start, p50 TTFT, p99 TTFT) of requests by arrival window."""
    buckets: dict[int, list[float]] = {}
    for d in res.done:
        buckets.setdefault(int(d.arrival // window_s), []).append(d.first - d.arrival)
    return [
        (k * window_s, percentile(v, 50), percentile(v, 99)) for k, v in sorted(buckets.items())
    ]
