"""`tessera bench scaling --via operator`: the module-scaling loop as a cluster runs it.

Two fresh agents (agent-0 a whole replica, agent-1 idle) behind
`bench_operator_harness.Cluster`: the test API server, the operator ticking the scaling loop
every `--tick-s`, and the gateway every request streams through (greedy). Load sweep: per
offered load, the same requests with `spec.policies.scaling.enabled` false then true (the bench
provokes the replication with `tpotP99Ms` 1 ms and 4 running requests until
`status.scaling.layerRuns` lists a run, then restores `--tpot-ms`; `evictAfterSeconds` is an
hour); turned off, the loop evicts the runs. Op table: the operations the loop applied, read
back from its `ModuleScaling` events (`scaling_loop.op_line`); the loop chooses the sizes. For
a migration (Algorithm 2's first phase, under a 1 ms target nothing meets) the bench waits
`--migrate-wait-s` and reports the loop's own line when none comes. Output: the parts
`bench_scaling.run` reports; caller: `bench_scaling.run`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import re
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tessera.bench import client, deployment
from tessera.cli import bench_operator_harness as h
from tessera.cli import local_agents
from tessera.control import scaling_loop

NAME = "scl"
GAMMA = re.compile(r"replicated \d+ layers, .*\(gamma ([0-9.]+)\)")


def manifest(model: Path, tpot_ms: float) -> dict[str, Any]:
    stages = [{"agent": "agent-0", "device": "cpu:0", "layers": [0, 8]}]
    return deployment.manifest(
        NAME,
        model,
        [{"name": "r0", "stages": stages}],
        32 << 20,
        slo={"tpotP99Ms": tpot_ms},
        # the runs stay while a load is measured; turning the policy off evicts them
        policies={"scaling": {"enabled": False, "evictAfterSeconds": 3600}},
    )


async def _runs(c: h.Cluster) -> list[Any]:
    status = (await c.deployment()).get("status") or {}
    return list((status.get("scaling") or {}).get("layerRuns") or [])


async def _set(
    c: h.Cluster, enabled: bool, runs: bool | None, tpot_ms: float | None = None
) -> None:
    """Turn the policy on or off and, unless `runs` is None, wait (with requests running:
    Algorithm 1 replicates only for a batch of more than one) until layer runs are (or
    are not) reported. The loop replicates only under a TPOT violation: runs are placed
    under `tpotP99Ms` 1 ms (every gap misses it), then the target goes back to `tpot_ms`."""
    spec: dict[str, Any] = {"policies": {"scaling": {"enabled": enabled}}}
    if tpot_ms is not None or runs:
        spec["slo"] = {"tpotP99Ms": 1 if runs else tpot_ms}
    await c.patch({"spec": spec})
    if runs is None:
        return

    async def settled() -> bool:
        return bool(await _runs(c)) == runs

    async with _traffic(c):
        await h.wait("layer runs placed" if runs else "layer runs evicted", settled, timeout=120)
    if runs and tpot_ms is not None:
        await c.patch({"spec": {"slo": {"tpotP99Ms": tpot_ms}}})


@contextlib.asynccontextmanager
async def _traffic(c: h.Cluster, n: int = 4) -> AsyncIterator[None]:
    """Requests kept running on the replica (`n` at a time) while the body runs."""
    stop = asyncio.Event()

    async def loop() -> None:
        seed = 1000
        while not stop.is_set():
            seed += 1
            await _load(c, 50.0, n, 32, seed)

    t = asyncio.create_task(loop())
    try:
        yield
    finally:
        stop.set()
        await t


async def _lines(c: h.Cluster, seen: set[str]) -> list[str]:
    """The loop's `ModuleScaling` lines not in `seen` (event names), oldest first."""
    return [
        e.message for e in await c.events() if e.reason == "ModuleScaling" and e.name not in seen
    ]


async def _load(
    c: h.Cluster, load: float, n: int, tokens: int, seed: int
) -> tuple[list[client.Stream], float]:
    rng = random.Random(seed)
    rs = [client.Stream([0, *(rng.randrange(5, 500) for _ in range(24))], tokens) for _ in range(n)]
    gaps = [rng.expovariate(load) for _ in range(n)]
    start = time.perf_counter()
    tasks = []
    for r, g in zip(rs, gaps, strict=True):
        await asyncio.sleep(g)
        tasks.append(asyncio.create_task(client.send(c.s, c.gateway, deployment.MODEL, r)))
    await asyncio.gather(*tasks)
    return rs, time.perf_counter() - start


_NONE: dict[str, Any] = {
    "op": "migrate", "start": 0, "end": 0, "seconds": 0.0, "pause_ms": 0.0,
    "param_bytes": 0, "kv_bytes": 0, "kv_pages": 0, "requests": 0,
}  # fmt: skip


def _row(op: dict[str, Any]) -> dict[str, Any]:
    """An op line's fields under `bench_scaling._row`'s keys."""
    return {
        "op": op["op"],
        "layers": op["end"] - op["start"],
        "seconds": round(op["seconds"], 4),
        "pause_ms": round(op["pause_ms"], 3),
        "param_bytes": op["param_bytes"],
        "kv_bytes": op["kv_bytes"],
        "kv_pages": op["kv_pages"],
        "requests_moved": op["requests"],
    }


async def _bench(
    agents: list[local_agents.AgentProcess],
    model: Path,
    loads: list[float],
    args: argparse.Namespace,
    work: Path,
) -> dict[str, Any]:
    out: dict[str, Any] = {"throughput_ratio_by_load": {}, "p99_ratio_by_load": {}, "runs": []}
    lost = 0
    async with h.Cluster(
        agents,
        model,
        manifest(model, args.tpot_ms),
        work,
        replicas=1,
        resync_seconds=10.0,  # the operator's default
        scaling_tick_seconds=args.tick_s,
    ) as c:
        for load in loads:
            res: dict[str, dict[str, float]] = {}
            for policy in ("off", "on"):
                seen = {e.name for e in await c.events()}
                if policy == "on":
                    await _set(c, True, runs=True, tpot_ms=args.tpot_ms)
                rs, wall = await _load(c, load, args.requests, args.tokens, args.seed)
                lost += sum(not r.ok for r in rs)
                lat = sorted(r.chunk_times[-1] - r.sent for r in rs if r.chunk_times)
                p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")
                lines = await _lines(c, seen)
                ops = [o for o in map(scaling_loop.parse_op_line, lines) if o is not None]
                gammas = [float(m.group(1)) for m in map(GAMMA.search, lines) if m]
                done_tokens = sum(len(r.chunk_times) for r in rs)
                res[policy] = {"tokens_per_s": done_tokens / wall, "p99_s": p99}
                out["runs"].append(
                    {
                        "gamma_used": gammas[0] if gammas else None,
                        "gamma_measured": None,  # measured inside the operator's loop
                        "load_rps": load,
                        "policy": policy,
                        "tokens_per_s": round(done_tokens / wall, 2),
                        "p99_s": round(p99, 3),
                        "replicated": [
                            f"[{o['start']},{o['end']})->{o['target']}"
                            for o in ops
                            if o["op"] == "replicate"
                        ],
                    }
                )
                if policy == "on":
                    await _set(c, False, runs=False)
            key = str(load)
            out["throughput_ratio_by_load"][key] = round(
                res["on"]["tokens_per_s"] / res["off"]["tokens_per_s"], 3
            )
            out["p99_ratio_by_load"][key] = round(res["on"]["p99_s"] / res["off"]["p99_s"], 3)
        migrated, out["migrate_reason"] = await _migrate(c, args)
        await asyncio.sleep(2 * args.tick_s)  # the loop's last lines (evictions) land
        lines = await _lines(c, set())
    out["op_table"] = [_row(o) for o in map(scaling_loop.parse_op_line, lines) if o is not None]
    if not migrated:  # the up path's rows of this op: null, with the reason beside
        out["op_table"].append(dict.fromkeys(_row(_NONE), None) | {"op": "migrate"})
    out["lost"] = lost
    return out


async def _migrate(c: h.Cluster, args: argparse.Namespace) -> tuple[bool, str]:
    """Algorithm 2 under an SLO nothing meets (module docstring): whether the loop
    migrated (its ops join the op table), and why (the loop's own line when it did not).
    The policy is turned on with the 1 ms target while requests run and no layer run is
    placed, so agent-1 is idle (a device holding a run is not a migration target) and
    the new loop's first window (the histogram since the gateway started) violates."""
    seen = {e.name for e in await c.events()}
    lines: list[str] = []
    async with _traffic(c, n=1):  # a batch of one: Algorithm 1 gains nothing, Algorithm 2 acts
        await asyncio.sleep(1.0)
        await _set(c, True, runs=None, tpot_ms=1)
        deadline = time.monotonic() + args.migrate_wait_s
        while time.monotonic() < deadline:
            lines = await _lines(c, seen)
            if any((scaling_loop.parse_op_line(m) or {}).get("op") == "migrate" for m in lines):
                break
            await asyncio.sleep(0.5)
    await _set(c, False, runs=None, tpot_ms=args.tpot_ms)
    if any((scaling_loop.parse_op_line(m) or {}).get("op") == "migrate" for m in lines):
        return True, "the loop migrated under tpotP99Ms 1 ms"
    downs = [m for m in lines if "scale down" in m] or lines or ["no ModuleScaling line"]
    return False, f"no migrate in {args.migrate_wait_s:.0f} s at tpotP99Ms 1 ms: {downs[-1]}"


def run(model: Path, loads: list[float], args: argparse.Namespace) -> dict[str, Any]:
    """The sweep and op table on 2 fresh agents (module docstring)."""
    agents = [local_agents.start_agent(f"agent-{i}", "cpu:1x2GiB", 1) for i in range(2)]
    try:
        with tempfile.TemporaryDirectory(prefix="tessera-scaling-op-") as tmp:
            return asyncio.run(_bench(agents, model, loads, args, Path(tmp)))
    finally:
        for a in agents:
            local_agents.stop_agent(a)
