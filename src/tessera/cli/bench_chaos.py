"""Chaos benchmark: agents and the reconcile loop killed mid-replay; nothing lost, tokens equal.

`tessera bench chaos --json [--requests N] [--time-scale X]` composes what `tessera up` runs, in
one process so each part can be interrupted: three local agents (r0 whole on agent-0; r1 a
2-stage pipeline on agent-1 and agent-2), the reconcile core, `tessera.cli.supervise`
restarting dead agents, and the gateway. The trace's first N requests are replayed clean, then
with chaos: at 25 % SIGKILL agent-2 (r1 fails over to r0; the next reconcile pass is cancelled
after one action and restarted); once r1 is back and past 55 %, SIGKILL agent-0. Keys:
`requests_sent`, `completed`, `lost`, `tokens_match` (each chaos-run text equals the clean
run's), `p99_ttft_ratio_vs_clean`, `recovery_s` per kill (to both replicas ready), and what was
killed when.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from tessera.bench import client, harness, local_up, trace
from tessera.cli import supervise

LAYOUT = """apiVersion: serving.tessera.dev/v1alpha1
kind: ServingDeployment
metadata: {name: chaos}
spec:
  model: {name: tiny-llama, path: MODEL, dtype: float32}
  layout:
    mode: explicit
    kvCacheBytes: 33554432
    replicas:
      - name: r0
        stages: [{agent: agent-0, device: cpu:0, layers: [0, 8]}]
      - name: r1
        stages:
          - {agent: agent-1, device: cpu:0, layers: [0, 4]}
          - {agent: agent-2, device: cpu:0, layers: [4, 8]}
  gateway: {port: 8000}
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    trace.add_arguments(
        parser, requests=96, time_scale=1.0, input_scale=0.05, max_input=128, max_output=24
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reconcile-interval", type=float, default=5.0)


class _Deployment:
    """Agents, supervisor, reconcile loop and gateway of one local deployment."""

    def __init__(self, dep: Any, model_path: str, interval_s: float) -> None:
        self.dep, self.model_path, self.interval_s = dep, model_path, interval_s
        self.procs: list[Any] = []
        self.refs: list[Any] = []
        self.gateway: Any = None
        self.supervisor: supervise.Supervisor | None = None
        self.loop_task: asyncio.Task[None] | None = None
        self.stop = asyncio.Event()
        self.applied = asyncio.Event()  # set when a reconcile pass applied an action
        self.passes = 0

    async def start(self) -> None:
        from tessera.cli import local_agents
        from tessera.control import agents, converge
        from tessera.gateway import config as gw_config
        from tessera.gateway import server as gw_server

        for i in range(3):
            self.procs.append(
                await asyncio.to_thread(local_agents.start_agent, f"agent-{i}", "cpu:1x1GiB", 1)
            )
        self.refs = [agents.AgentRef(p.agent_id, p.address) for p in self.procs]
        out = await converge.converge(self.dep, self.model_path, self.refs, tls=self.procs[0].tls)
        if out.reason != "Serving":
            raise SystemExit(f"tessera bench chaos: {out.reason}: {out.message}")
        self.gateway = await gw_server.start_gateway(
            gw_config.GatewayConfig(
                model_name="tiny-llama",
                model_path=self.model_path,
                port=0,
                replicas=tuple(gw_config.ReplicaEndpoint(r, a) for r, a in self._leaders(out)),
                poll_interval_s=0.25,
                failure_backoff_s=0.5,
                tls=self.procs[0].tls,
            )
        )
        self.supervisor = supervise.start(self.procs, "cpu:1x1GiB", 1, lambda s: None)
        self.start_loop()

    def _leaders(self, out: Any) -> list[tuple[str, str]]:
        address = {r.name: r.address for r in self.refs}
        return [(r.replica_id, address[r.stages[0].agent]) for r in out.plan.replicas]

    def start_loop(self) -> None:
        self.loop_task = asyncio.get_running_loop().create_task(self._reconcile_loop())

    async def _reconcile_loop(self) -> None:
        from tessera.control import converge

        def progress(result: Any) -> None:
            self.applied.set()

        while not self.stop.is_set():
            await supervise.wait(self.stop, self.interval_s, self.supervisor)
            if self.stop.is_set():
                return
            self.passes += 1
            out = await converge.converge(
                self.dep, self.model_path, self.refs, progress, tls=self.procs[0].tls
            )
            if out.plan is not None:
                from tessera.gateway import config as gw_config

                self.gateway.update_replicas(
                    [gw_config.ReplicaEndpoint(r, a) for r, a in self._leaders(out)]
                )

    async def kill_loop(self) -> None:
        """Kill the reconcile loop (as the operator dying): cancel its task mid-pass."""
        assert self.loop_task is not None
        self.loop_task.cancel()
        try:
            await self.loop_task
        except asyncio.CancelledError:
            pass

    def all_ready(self) -> bool:
        return len(self.gateway.ready_replicas()) == 2

    async def close(self) -> None:
        from tessera.cli import local_agents

        self.stop.set()
        if self.loop_task is not None:
            await self.kill_loop()
        await supervise.stop(self.supervisor)
        if self.gateway is not None:
            await self.gateway.stop()
        for p in self.procs:
            local_agents.stop_agent(p)


async def _replay(
    url: str, reqs: list[tuple[float, int, int]], seed: int, active: list[int] | None = None
) -> dict[str, Any]:
    """Per request: text and TTFT (None when it failed); `active[0]` counts streams open."""
    streams = trace.streams(reqs, random.Random(seed))
    t0 = time.perf_counter()

    async def one(s: client.Stream, session: Any) -> None:
        await asyncio.sleep(max(0.0, t0 + s.at - time.perf_counter()))
        if active is not None:
            active[0] += 1
        try:
            await client.send(session, url, "tiny-llama", s)
        finally:
            if active is not None:
                active[0] -= 1

    async with client.session(600) as session:
        await asyncio.gather(*(one(s, session) for s in streams))
    errors = [
        s.error or f"request {i}: {s.usage_tokens} of {s.max_tokens} tokens"
        for i, s in enumerate(streams)
        if s.error or s.usage_tokens != s.max_tokens
    ]
    good = [not s.error and s.usage_tokens == s.max_tokens for s in streams]
    return {
        "texts": [s.text if g else None for s, g in zip(streams, good, strict=True)],
        "ttft": [s.ttft if g else None for s, g in zip(streams, good, strict=True)],
        "errors": errors,
    }


async def _until(cond: Any, timeout: float, every: float = 0.05) -> float:
    """Seconds until `cond()` holds (raises after `timeout`)."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(every)
    return time.monotonic() - t0


async def _chaos(
    d: _Deployment, span_s: float, log: list[dict[str, Any]], active: list[int]
) -> list[float]:
    """The kills; returns the recovery time of each agent kill."""
    t0 = time.monotonic()
    recoveries = []
    for victim, at_fraction in ((2, 0.25), (0, 0.55)):
        await asyncio.sleep(max(0.0, t0 + at_fraction * span_s - time.monotonic()))
        proc = d.procs[victim]
        killed = time.monotonic()
        os.kill(proc.proc.pid, signal.SIGKILL)
        log.append(
            {
                "t_s": round(killed - t0, 2),
                "event": f"SIGKILL agent-{victim}",
                "requests_streaming": active[0],
            }
        )
        await _until(lambda: not d.all_ready(), 30)
        if victim == 2:  # kill the reconcile pass that reloads it, once it has acted
            d.applied.clear()
            await _until(d.applied.is_set, 120)
            await d.kill_loop()
            log.append({"t_s": round(time.monotonic() - t0, 2), "event": "reconcile loop killed"})
            d.start_loop()
            assert d.supervisor is not None
            d.supervisor.restarted.set()  # the new loop converges at once
        await _until(d.all_ready, 180)
        recoveries.append(round(time.monotonic() - killed, 2))
        log.append({"t_s": round(time.monotonic() - t0, 2), "event": "both replicas ready"})
    return recoveries


async def _bench(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    import yaml

    from tessera import api

    reqs = trace.load(args)
    dep = api.parse(yaml.safe_load(LAYOUT.replace("MODEL", str(model))))
    d = _Deployment(dep, str(model), args.reconcile_interval)
    try:
        await d.start()
        await _replay(d.gateway.url, reqs[:8], args.seed + 1)  # warm-up, not measured
        clean = await _replay(d.gateway.url, reqs, args.seed)
        log: list[dict[str, Any]] = []
        active = [0]
        chaos_task = asyncio.create_task(_chaos(d, reqs[-1][0], log, active))
        chaotic = await _replay(d.gateway.url, reqs, args.seed, active)
        recoveries = await chaos_task
        passes = d.passes
    finally:
        await d.close()
    pairs = [
        (a, b)
        for a, b in zip(clean["texts"], chaotic["texts"], strict=True)
        if a is not None and b is not None
    ]
    ttft_clean = [t for t in clean["ttft"] if t is not None]
    ttft_chaos = [t for t in chaotic["ttft"] if t is not None]
    p99_clean = harness.pct(ttft_clean, 99)
    p99_chaos = harness.pct(ttft_chaos, 99)
    completed = sum(t is not None for t in chaotic["texts"])
    return {
        "requests_sent": len(reqs),
        "completed": completed,
        "lost": len(reqs) - completed,
        "clean_completed": sum(t is not None for t in clean["texts"]),
        "tokens_match": bool(pairs) and all(a == b for a, b in pairs),
        "greedy_compared": len(pairs),
        "p99_ttft_ms_clean": round(p99_clean * 1e3, 1),
        "p99_ttft_ms_chaos": round(p99_chaos * 1e3, 1),
        "p99_ttft_ratio_vs_clean": round(p99_chaos / p99_clean, 2),
        "recovery_s": max(recoveries),
        "recovery_s_per_kill": recoveries,
        "reconcile_passes": passes,
        "events": log,
        "errors": (clean["errors"] + chaotic["errors"])[:5],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tessera-chaos-") as tmp:
        model = local_up.make_tiny(Path(tmp) / "tiny-llama")
        result = asyncio.run(_bench(args, model))
    return {
        **result,
        "time_scale": args.time_scale,
        "trace": str(args.trace),
        "setup": "3 local agents (r0 whole on agent-0; r1 2 stages on agent-1, agent-2), "
        "supervisor + reconcile loop + gateway in one process; same requests clean, "
        "then with kills",
        "transforms": trace.transforms(args),
        "machine": harness.machine(),
    }
