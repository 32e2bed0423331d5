"""The replica autoscaler inside `tessera up` (issue 32): beside the in-process gateway.

When `spec.scaling.enabled`, `tessera up` ticks the same loop the operator ticks
(`tessera.control.autoscale_loop`) every `AUTOSCALE_TICK_S`: the demand comes from the
in-process gateway (its hold queue's `held`, its calls per replica as `GET
/admin/v1/load` lists them, its TTFT histogram) instead of HTTP; the leaders are the
plan's stage-0 agents. Ticks run under the pass lock (a sleep never interleaves with a
converge pass's loads). Each event is printed. An auto layout is resized as the
operator resizes it: `target` plays `status.autoscaling.desiredReplicas` (the count the
pure decision asks for), `cap` is what every converge pass of `up` plans
(`autoscale.plan_cap`), `resized` is set when the count changes so `up_watch.run_loop`
runs a pass at once, and `follow` takes each pass's plan as the loop's members.
`hold_config` turns `spec.scaling.hold` into the gateway's hold settings. Caller:
`up_cmd._serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping

from tessera import api
from tessera.control import autoscale_loop, gateway_demand, gateway_load
from tessera.gateway import hold
from tessera.gateway import server as gw_server
from tessera.policies.scaling import autoscale
from tessera.policies.scaling import signal as sig

AUTOSCALE_TICK_S = 0.5
Say = Callable[[str], None]


def hold_config(spec: api.DeploymentSpec) -> hold.HoldConfig:
    h = spec.scaling.hold
    return hold.HoldConfig(max_held=h.max_requests, deadline_s=h.deadline_seconds)


def demand(gateway: gw_server.GatewayHandle, replica_ids: list[str]) -> gateway_demand.Demand:
    """The in-process gateway's demand, as `gateway_demand.fetch` reads it over HTTP."""
    calls = {
        rid: tuple(
            gateway_load.Call(len(a.prompt_ids), a.max_tokens, a.first_token_at is not None)
            for a in gateway.in_flight(rid)
        )
        for rid in replica_ids
    }
    holding = gateway.service.holding
    families = list(gateway.service.metrics.ttft.collect())
    ttft = sig.from_samples(families[0].samples) if families else None
    return gateway_demand.from_calls(calls, holding.held if holding else 0, ttft)


class UpAutoscale:
    """One loop over the plan's replicas (`members`: replica id -> leader address, every
    planned one); `run` until `stop`."""

    def __init__(
        self,
        dep: api.ServingDeployment,
        members: Mapping[str, str],
        gateway: gw_server.GatewayHandle,
        say: Say,
    ) -> None:
        self.dep, self.members, self.gateway, self.say = dep, dict(members), gateway, say
        self.loop = autoscale_loop.AutoscaleLoop(
            autoscale_loop.Leaders(tls=gateway.config.tls), deployment=dep.name
        )
        self.cfg = dep.spec.scaling.config(dep.spec.slo.ttft_p99_ms / 1000.0)
        self.target: int | None = None  # the plan count asked for (desiredReplicas)
        self.resized = asyncio.Event()  # the count changed: a converge pass, now

    def cap(self, dep: api.ServingDeployment) -> int | None:
        """The plan count a converge pass of `dep` gives an auto layout (None: the
        planner's own), as the operator's pass reads `status.autoscaling`."""
        have = {"desiredReplicas": self.target} if self.target is not None else None
        cfg = dep.spec.scaling.config()
        return autoscale.plan_cap(cfg.enabled, dep.spec.layout.mode, have, cfg.max_replicas)

    def follow(self, dep: api.ServingDeployment, members: Mapping[str, str]) -> None:
        """After a converge pass: its spec (a manifest edit) and its planned replicas."""
        self.dep, self.members = dep, dict(members)
        self.cfg = dep.spec.scaling.config(dep.spec.slo.ttft_p99_ms / 1000.0)

    async def tick(self) -> autoscale_loop.Tick:
        resize = autoscale_loop.Resize(
            len(self.members), self.cap(self.dep), self.dep.spec.layout.mode == "auto"
        )
        out = await self.loop.tick(
            self.members, demand(self.gateway, list(self.members)), self.cfg, resize
        )
        for e in out.events:
            self.say(f"autoscale {e.kind} {e.reason}: {e.message}")
        dec = out.decision
        if dec is not None and dec.replicas is not None and dec.replicas != self.target:
            self.target = dec.replicas
            self.resized.set()  # the next converge pass plans that many
        if out.acted:
            await self.gateway.refresh()  # route to the woken at once, not at the next poll
        return out

    async def run(self, stop: asyncio.Event, lock: asyncio.Lock, interval_s: float) -> None:
        """Tick every `interval_s` under `lock` until `stop`; a failed tick is said and
        the loop goes on."""
        try:
            while not stop.is_set():
                try:
                    async with lock:
                        await self.tick()
                except Exception as exc:  # the loop survives anything
                    self.say(f"autoscale: tick failed: {type(exc).__name__}: {exc}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval_s)
        finally:
            await self.loop.close()


def start(
    dep: api.ServingDeployment,
    members: Mapping[str, str],
    gateway: gw_server.GatewayHandle,
    stop: asyncio.Event,
    lock: asyncio.Lock,
    say: Say,
) -> tuple[UpAutoscale, asyncio.Task[None]] | None:
    """The loop and its task when `spec.scaling.enabled` (None when off)."""
    if not dep.spec.scaling.enabled:
        return None
    up = UpAutoscale(dep, members, gateway, say)
    c = up.cfg
    resizing = " (auto layout: the plan is resized)" if dep.spec.layout.mode == "auto" else ""
    say(
        f"autoscale on {len(members)} replicas (awake {c.min_replicas}.."
        f"{c.max_replicas or len(members)}, sleep after {c.sleep_after_s:g}s idle){resizing}"
    )
    return up, asyncio.get_running_loop().create_task(up.run(stop, lock, AUTOSCALE_TICK_S))
