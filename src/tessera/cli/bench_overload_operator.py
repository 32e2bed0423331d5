"""`tessera bench overload --via operator`: the same replay, served the way a cluster serves it.

One run (policy off or on) on fresh agents behind the test API server (KMock), the operator
and the gateway, each its own process (`bench_operator_harness.Cluster`): a ServingDeployment
of 4 whole replicas with `spec.policies.overload.enabled` as asked, the replay streamed to
the gateway's `/v1/completions`. The gateway routes by least outstanding work, as the
replay's router does (docs/overload.md says why). Drops, restores, exchange and pause times
come from the loop's `OverloadShifted` events, with how long the drops waited for the
gateway to stop routing their donors (`drop_routes_ms`) and for the donors to drain
(`drop_drain_ms`). Output: what `bench_overload_replay.replay`
returns, with each request's text. Caller: `bench_overload.run`.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from tessera.bench import client, deployment, harness, trace
from tessera.cli import bench_operator_harness as h
from tessera.cli import bench_overload_scenario as scenario
from tessera.cli import bench_overload_timeline as timeline
from tessera.cli import local_agents

NAME = "ovl"


def manifest(model: Path, kv_bytes: int, policy: bool) -> dict[str, Any]:
    replicas = [
        {"name": f"r{i}", "stages": [{"agent": f"agent-{i}", "device": "cpu:0", "layers": [0, 8]}]}
        for i in range(4)
    ]
    return deployment.manifest(
        NAME, model, replicas, kv_bytes, policies={"overload": {"enabled": policy}}
    )


async def _replay(
    agents: list[local_agents.AgentProcess],
    replay: trace.Replay,
    kv_bytes: int,
    policy: bool,
    tick_s: float,
    work: Path,
    nice: int = 0,
) -> dict[str, Any]:
    async with h.Cluster(
        agents,
        replay.model,
        manifest(replay.model, kv_bytes, policy),
        work,
        replicas=4,
        kv_dispatch=False,
        api_nice=nice,  # as the agents: a cluster's API server has CPUs of its own
        resync_seconds=10.0,  # the operator's default
        overload_tick_seconds=tick_s,
    ) as c:
        rs = [
            client.Stream(p, out, at)
            for p, (at, _, out) in zip(replay.prompts, replay.reqs, strict=True)
        ]
        start, epoch = time.perf_counter(), time.time()
        await asyncio.gather(*(client.send(c.s, c.gateway, deployment.MODEL, r, start) for r in rs))
        wall = time.perf_counter() - start

        async def whole() -> bool:  # the loop restores once the burst is served
            status = (await c.deployment()).get("status") or {}
            return not (status.get("overload") or {}).get("groups")

        await h.wait("whole replicas again", whole, timeout=120)
        listed = await c.events()
    items = [(e.reason, e.message) for e in listed]
    shifts = [
        timeline.shift(e.message, _seconds(e.time) - epoch)
        for e in listed
        if e.reason == "OverloadShifted" and e.time
    ]
    ttft = [r.ttft for r in rs if r.ttft is not None]
    tpot = [
        (r.chunk_times[-1] - r.chunk_times[0]) / (r.max_tokens - 1)
        for r in rs
        if r.chunk_times and r.max_tokens > 1
    ]
    shifted = [m for reason, m in items if reason == "OverloadShifted"]
    return {
        "requests": rs,
        "wall_s": wall,
        **harness.latency_ms(ttft, tpot),
        "lost": sum(not r.ok for r in rs),
        "slowest": scenario.slowest([r.at for r in rs], [r.ttft for r in rs]),
        "slowest_phased": timeline.slowest(shifts, [r.at for r in rs], [r.ttft for r in rs]),
        "shifts": [[s.start, s.end, s.drops, s.restores] for s in shifts],
        "drops": sum(_count(m, "drops") for m in shifted),
        "restores": sum(_count(m, "restores") for m in shifted),
        "fallbacks": sum(reason == "DropInsufficient" for reason, _ in items),
        "exchange_ms": sum(_ms(m, "exchange") for m in shifted),
        "paused_ms": sum(_ms(m, "paused") for m in shifted),
        "drop_routes_ms": sum(_ms(m, "drop routes") for m in shifted),
        "drop_drain_ms": sum(_ms(m, "drop drain") for m in shifted),
        "events": [f"{r}: {m}" for r, m in items if r.startswith(("Overload", "Drop"))],
    }


def _seconds(stamp: str) -> float:
    """An event's RFC 3339 time as seconds since the epoch."""
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _count(message: str, key: str) -> int:
    m = re.search(rf"([0-9]+) {key}", message)
    return int(m.group(1)) if m else 0


def _ms(message: str, key: str) -> float:
    m = re.search(rf"{key} ([0-9.]+) ms", message)
    return float(m.group(1)) if m else 0.0


def run_once(
    replay: trace.Replay, kv_bytes: int, policy: bool, tick_s: float, nice: int = 0
) -> dict[str, Any]:
    """One replay on 4 fresh agents at niceness `nice` (module docstring)."""
    agents = [scenario.start_agent(f"op-{'on' if policy else 'off'}-{i}", nice) for i in range(4)]
    try:
        with tempfile.TemporaryDirectory(prefix="tessera-overload-op-") as tmp:
            return asyncio.run(_replay(agents, replay, kv_bytes, policy, tick_s, Path(tmp), nice))
    finally:
        for a in agents:
            local_agents.stop_agent(a)
