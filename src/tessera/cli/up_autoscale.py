"""The replica autoscaler inside `tessera up` (issue 32): beside the in-process gateway.

When `spec.scaling.enabled`, `tessera up` ticks the same loop the operator ticks
(`tessera.control.autoscale_loop`) every `AUTOSCALE_TICK_S`: the demand comes from the
in-process gateway (its hold queue's `held`, its calls per replica as `GET
/admin/v1/load` lists them, its TTFT histogram) instead of HTTP; the leaders are the
plan's stage-0 agents. Ticks run under the pass lock (a sleep never interleaves with a
converge pass's loads). Each event is printed. `hold_config` turns `spec.scaling.hold`
into the gateway's hold settings. Caller: `up_cmd._serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping

from tessera import api
from tessera.control import autoscale_loop, gateway_demand, gateway_load
from tessera.gateway import hold
from tessera.gateway import server as gw_server
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
    """One loop over the plan's replicas; `run` until `stop`."""

    def __init__(
        self,
        dep: api.ServingDeployment,
        members: Mapping[str, str],
        gateway: gw_server.GatewayHandle,
        say: Say,
    ) -> None:
        self.dep, self.members, self.gateway, self.say = dep, dict(members), gateway, say
        self.loop = autoscale_loop.AutoscaleLoop(deployment=dep.name)
        self.cfg = dep.spec.scaling.config(dep.spec.slo.ttft_p99_ms / 1000.0)

    async def tick(self) -> autoscale_loop.Tick:
        out = await self.loop.tick(self.members, demand(self.gateway, list(self.members)), self.cfg)
        for e in out.events:
            self.say(f"autoscale {e.kind} {e.reason}: {e.message}")
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
) -> asyncio.Task[None] | None:
    """The loop's task when `spec.scaling.enabled` (None when off)."""
    if not dep.spec.scaling.enabled:
        return None
    up = UpAutoscale(dep, members, gateway, say)
    c = up.cfg
    say(
        f"autoscale on {len(members)} replicas (awake {c.min_replicas}.."
        f"{c.max_replicas or len(members)}, sleep after {c.sleep_after_s:g}s idle)"
    )
    return asyncio.get_running_loop().create_task(up.run(stop, lock, AUTOSCALE_TICK_S))
