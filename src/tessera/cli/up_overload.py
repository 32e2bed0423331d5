"""The overload loop's tick as `tessera up` runs it beside its gateway (issue 13).

`UpOverload.tick` is one observe -> decide -> actuate -> report pass of the level-triggered
loop the operator ticks (`tessera.control.overload`): the agents as observed in the pass
(`tessera.control.observation`: after a converge pass, under the same lock, the pass's own
observation), the calls per replica that only the gateway sees, one `OverloadLoop.tick`
over the plan's whole replicas with `dropThreshold` / `restoreThreshold` from the spec, the
events said. The caller supplies the gateway side: `beside_gateway` reads `tessera up`'s
in-process gateway (its in-flight table, ordered as `GET /admin/v1/load`; routes steps
apply the last published routes document less the donors, same version: the gateway
drains them); `tessera bench overload`'s replay (`cli/bench_overload_replay`) its own
router. A tick and a reconcile pass never overlap (both are passes of the deployment's
`observation.Pass`). Callers: `up_cmd._serve`, `bench_overload_replay.replay`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tessera import observed, plan, routes_doc
from tessera.control import gateway_load, observation, overload_driver
from tessera.control import overload as control
from tessera.gateway import routes as gw_routes
from tessera.gateway import server as gw_server
from tessera.policies.overload import held as overload_held
from tessera.policies.overload import monitor as overload
from tessera.policies.overload import steps as overload_steps
from tessera.rpc import transport

Published = Callable[[], routes_doc.RoutesDoc]
Print = Callable[[str], None]
Calls = Callable[[], gateway_load.Calls]  # each member's calls, as the gateway sees them


def _whole(p: plan.Plan) -> list[plan.PlannedReplica]:
    return [r for r in p.replicas if len(r.stages) == 1 and r.stages[0].tp == 1]


def page_bytes(obs: observed.Observed, replica_id: str) -> int:
    """Bytes of one whole-model KV page of `replica_id`, from its block (0: unknown)."""
    for a in obs.agents:
        for b in a.blocks:
            if b.replica_id == replica_id and b.num_stages == 1 and b.kv_pages:
                return b.kv_bytes // b.kv_pages
    return 0


def whole_members(p: plan.Plan, obs: observed.Observed) -> list[overload_held.Member]:
    """The plan's whole replicas as the loop takes them: id, agent, the agent's address."""
    addr = {a.name: a.address for a in obs.agents}
    return [
        overload_held.Member(r.replica_id, r.stages[0].agent, addr.get(r.stages[0].agent, ""))
        for r in _whole(p)
    ]


def gateway_calls(
    gateway: gw_server.GatewayHandle, held: Sequence[overload_held.Member]
) -> dict[str, tuple[gateway_load.Call, ...]]:
    """The in-process gateway's calls per member, most likely waiting first (as
    `/admin/v1/load` orders them)."""
    out = {}
    for m in held:
        on = sorted(
            gateway.in_flight(m.replica_id),
            key=lambda a: (a.first_token_at is not None, a.last_token_at or a.started),
        )
        out[m.replica_id] = tuple(
            gateway_load.Call(len(a.prompt_ids), a.max_tokens, a.first_token_at is not None)
            for a in on
        )
    return out


def routes_change(
    doc: routes_doc.RoutesDoc,
    change: overload_steps.Routes,
    members: dict[str, overload_steps.Member],
) -> routes_doc.RoutesDoc:
    """`doc` less the replicas `change` removes, plus those it adds (at their leader)."""
    return control.routes_change(doc, change, {r: m.address for r, m in members.items()})


class UpOverload:
    """One loop over a deployment's whole replicas (`held`); `tick` per pass, or `run`
    until `stop`. The caller supplies what only the gateway sees: `calls` (each member's
    calls, most likely waiting first, as `GET /admin/v1/load` lists them) and `set_routes`
    (the loop's routes steps). `beside_gateway` feeds it `tessera up`'s in-process gateway;
    `tessera bench overload`'s replay feeds it the bench's own router."""

    def __init__(
        self,
        held: Sequence[overload_held.Member],
        cfg: overload.OverloadConfig,
        num_layers: int,
        calls: Calls,
        set_routes: overload_driver.SetRoutes,
        say: Print,
        *,
        tls: transport.TlsFiles | None,
    ) -> None:
        self.held = list(held)
        self.members = dict(overload_held.step_members(self.held))
        self.cfg, self.num_layers = cfg, num_layers
        self.calls, self.say = calls, say
        self.loop = control.OverloadLoop(overload_driver.Driver(set_routes, chunk_pages=4, tls=tls))

    @staticmethod
    def usable(p: plan.Plan, obs: observed.Observed) -> str:
        """Why the loop cannot run on this plan ("" when it can)."""
        whole = _whole(p)
        if len(whole) < 2:
            return "overload: needs at least two whole-model replicas; the loop is off"
        if not page_bytes(obs, whole[0].replica_id):
            return "overload: the agents report no KV pages; the loop is off"
        return ""

    async def tick(self, seen: observation.Observation) -> control.Tick:
        """One tick over the pass's observation (the caller holds the pass lock)."""
        obs = await seen.get()
        out = await self.loop.tick(self.held, self.cfg, self.num_layers, obs, self.calls())
        if out.acted:
            seen.acted()
        for e in out.events:
            self.say(f"overload {e.kind} {e.reason}: {e.message}")
        if out.drops or out.restores:
            self.say(
                f"overload: {out.drops} drops, {out.restores} restores (exchange "
                f"{out.exchange_s * 1e3:.1f} ms, paused {out.paused_s * 1e3:.1f} ms)"
            )
        return out

    async def run(self, stop: asyncio.Event, held: observation.Pass, interval_s: float) -> None:
        """Tick every `interval_s`, each a pass of `held`, until `stop`."""
        try:
            while not stop.is_set():
                async with held.held() as seen:
                    await self.tick(seen)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval_s)
        finally:
            await self.loop.close()


def beside_gateway(
    p: plan.Plan,
    obs: observed.Observed,
    cfg: overload.OverloadConfig,
    num_layers: int,
    gateway: gw_server.GatewayHandle,
    published: Published,
    say: Print,
) -> UpOverload:
    """The loop beside `tessera up`'s in-process gateway: its in-flight table as the calls;
    a routes step applies the last published routes document less the donors."""
    held = whole_members(p, obs)
    members = dict(overload_held.step_members(held))

    async def set_routes(change: overload_steps.Routes) -> None:
        doc = routes_change(published(), change, members)
        gateway.apply_routes(gw_routes.from_doc(doc))

    return UpOverload(
        held,
        cfg,
        num_layers,
        lambda: gateway_calls(gateway, held),
        set_routes,
        say,
        tls=gateway.config.tls,
    )


def guarded(
    held: observation.Pass, one_pass: Callable[[Any, observation.Observation], Awaitable[bool]]
) -> Callable[[Any], Awaitable[bool]]:
    """`one_pass(current, seen)` as a pass of `held`: it never overlaps a loop tick, and
    `seen` is the observation it shares with the ticks it runs."""

    async def run(current: Any) -> bool:
        async with held.held() as seen:
            return await one_pass(current, seen)

    return run


def start(dep: Any, outcome: Any, gateway: Any, published: Any) -> UpOverload | None:
    """The overload loop beside the gateway (an `UpOverload`) when
    `spec.policies.overload.enabled`; None when it is off or cannot run on this plan
    (said why)."""
    from rich.console import Console

    from tessera import model_facts

    cfg = dep.spec.policies.overload
    if not cfg.enabled:
        return None
    say = Console(stderr=True).print
    why = UpOverload.usable(outcome.plan, outcome.observed)
    shape = model_facts.served_shape(outcome.plan.model_path, dep.spec.model.dtype)
    if why or shape is None:
        say(why or "overload: model config unreadable; the loop is off")
        return None
    ov = beside_gateway(
        outcome.plan, outcome.observed, cfg, shape.num_layers, gateway, published, say
    )
    say(
        f"overload loop on {len(ov.members)} replicas (drop at {cfg.drop_threshold}, "
        f"restore below {cfg.restore_threshold})"
    )
    return ov
