"""Calibration: the simulator on the configuration `tessera bench serve` runs for real.

Input: a measured profile of the tiny model (`tessera profile` against a local agent), the
Azure trace, and the serve bench's transforms (first N requests, prompt = clip(round(
ContextTokens x 0.1), 1, 512), output = clip(round(GeneratedTokens x 0.1), 1, 64), gaps /
time scale). Output: simulated throughput and TTFT / inter-token percentiles on the same
layout (examples/local-tiny.yaml: r0 whole model, r1 two stages, 64 MiB of KV per stage),
for `tessera.sim.bench` to set beside a measured `tessera bench serve --json`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tessera.cost.latency import StageSpec
from tessera.cost.profile import Profile
from tessera.policies.routing.shares import Router
from tessera.policies.serving import batching
from tessera.sim import arrivals, engine, report
from tessera.sim.replica import SimReplica
from tessera.sim.steptime import StepModel
from tessera.workload import traces

KV_BYTES_PER_STAGE = 64 * 2**20  # examples/local-tiny.yaml kvCacheBytes
PAGE_SIZE = 16


def serve_arrivals(trace: str | Path, requests: int, time_scale: float) -> list[arrivals.Arrival]:
    """The serve bench's requests (same transforms; see the module docstring)."""
    rows = traces.read_trace(trace)[:requests]
    t0 = rows[0].timestamp
    return [
        arrivals.Arrival(
            (r.timestamp - t0) / time_scale,
            min(max(round(r.input_tokens * 0.1), 1), 512),
            min(max(round(r.output_tokens * 0.1), 1), 64),
        )
        for r in rows
    ]


def _replica(name: str, prof: Profile, runs: list[int]) -> SimReplica:
    link = prof.comm.intra_node
    stages = [
        StageSpec(n, i == 0, i == len(runs) - 1, None if i == len(runs) - 1 else link)
        for i, n in enumerate(runs)
    ]
    per_token = prof.memory.kv_bytes_per_token
    pages = min(KV_BYTES_PER_STAGE // (per_token * n * PAGE_SIZE) for n in runs)
    page_bytes = per_token * prof.model.num_layers * PAGE_SIZE
    model = StepModel(prof, stages, 1, link)
    return SimReplica(name, model, pages, PAGE_SIZE, page_bytes, batching.BatchLimits())


def simulate_serve(
    prof: Profile, trace: str | Path, requests: int = 200, time_scale: float = 8.0
) -> dict[str, Any]:
    """Simulated figures named like the serve bench's."""
    L = prof.model.num_layers
    reps = [_replica("r0", prof, [L]), _replica("r1", prof, [L // 2, L - L // 2])]
    arr = serve_arrivals(trace, requests, time_scale)
    res = engine.Engine(reps, Router(0)).run(arr)
    s = report.summary(res)
    wall = max(d.finish for d in res.done)
    itl = [(d.finish - d.first) / (d.output - 1) for d in res.done if d.output > 1]
    return {
        "simulated": True,
        "completed": s["requests"],
        "throughput_tok_s": round(sum(d.output for d in res.done) / wall, 1),
        "ttft_p50_ms": round(s["ttft_p50_s"] * 1e3, 1),
        "ttft_p99_ms": round(s["ttft_p99_s"] * 1e3, 1),
        "itl_p50_ms": round(report.percentile(itl, 50) * 1e3, 1),
    }
