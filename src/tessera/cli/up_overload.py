"""The overload loop inside `tessera up` (issue 13): beside the in-process gateway.

Where it runs: `tessera up` supervises the agents and the gateway in one process, so
when `spec.policies.overload.enabled` it also runs `overload_loop.OverloadLoop` there
(the operator does not: in a cluster the gateway is its own Deployment, and the loop
needs the gateway's in-flight requests and its routes; the operator's reconcile keeps
a drop as desired and reports it, `docs/overload.md`). Inputs: the converged plan's
whole replicas (members: replica id, leader address), `dropThreshold` /
`restoreThreshold` from the spec, parameter bytes per layer from the plan, bytes per
whole-model KV page from the agents' blocks. Queued requests' KV needs come from the
gateway's in-flight table (requests on a replica with no token yet, prompt + max
tokens, the bench's approximation: a request still in prefill counts as queued). The
loop's routes steps apply the last published routes document less the donors (same
version: the gateway drains them). A tick and a reconcile pass never overlap (`lock`):
between a drop's routes step and the donors' renaming a pass would see the donors as
whole replicas to route again. Caller: `up_cmd._serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from tessera import blocks, observed, plan, routes_doc
from tessera.control import overload_driver, overload_loop
from tessera.gateway import routes as gw_routes
from tessera.gateway import server as gw_server
from tessera.policies import overload, overload_steps
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

Published = Callable[[], routes_doc.RoutesDoc]
Print = Callable[[str], None]


def _whole(p: plan.Plan) -> list[plan.PlannedReplica]:
    return [r for r in p.replicas if len(r.stages) == 1 and r.stages[0].tp == 1]


def page_bytes(obs: observed.Observed, replica_id: str) -> int:
    """Bytes of one whole-model KV page of `replica_id`, from its block (0: unknown)."""
    for a in obs.agents:
        for b in a.blocks:
            if b.replica_id == replica_id and b.num_stages == 1 and b.kv_pages:
                return b.kv_bytes // b.kv_pages
    return 0


def routes_change(
    doc: routes_doc.RoutesDoc,
    change: overload_steps.Routes,
    members: dict[str, overload_steps.Member],
) -> routes_doc.RoutesDoc:
    """`doc` less the replicas `change` removes, plus those it adds (at their leader)."""
    keep = [r for r in doc.replicas if r.id not in change.remove]
    have = {r.id for r in keep}
    keep += [
        routes_doc.RouteReplica(rid, members[rid].address)
        for rid in change.add
        if rid not in have and rid in members
    ]
    return dataclasses.replace(doc, replicas=tuple(keep))


class UpOverload:
    """One loop over a deployment's whole replicas; `run` until `stop`."""

    def __init__(
        self,
        p: plan.Plan,
        obs: observed.Observed,
        cfg: overload.OverloadConfig,
        num_layers: int,
        gateway: gw_server.GatewayHandle,
        published: Published,
        say: Print,
    ) -> None:
        whole = _whole(p)
        addr = {a.name: a.address for a in obs.agents}
        self.members = {
            r.replica_id: overload_steps.Member(r.replica_id, addr.get(r.stages[0].agent, ""))
            for r in whole
        }
        per_layer = p.param_bytes.get((whole[0].replica_id, 0), 0) // max(1, num_layers)
        self.page_bytes = page_bytes(obs, whole[0].replica_id)
        self.page_size = blocks.DEFAULT_PAGE_SIZE
        self.gateway, self.published, self.say = gateway, published, say
        self.channels: dict[str, Any] = {}
        self.loop = overload_loop.OverloadLoop(
            self.members,
            cfg,
            (per_layer,) * num_layers,
            self.page_bytes,
            self.queued_bytes,
            overload_driver.Driver(self.set_routes, chunk_pages=4),
            self.describe,
            self.on_event,
        )

    @staticmethod
    def usable(p: plan.Plan, obs: observed.Observed) -> str:
        """Why the loop cannot run on this plan ("" when it can)."""
        whole = _whole(p)
        if len(whole) < 2:
            return "overload: needs at least two whole-model replicas; the loop is off"
        if not page_bytes(obs, whole[0].replica_id):
            return "overload: the agents report no KV pages; the loop is off"
        return ""

    def queued_bytes(self, replica_id: str) -> list[int]:
        return [
            overload.request_kv_bytes(
                len(a.prompt_ids), a.max_tokens, self.page_size, self.page_bytes
            )
            for a in self.gateway.in_flight(replica_id)
            if a.first_token_at is None
        ]

    async def describe(self, address: str) -> pb.DescribeReply:
        ch = self.channels.get(address)
        if ch is None:
            ch = self.channels[address] = transport.channel(address)
        reply: pb.DescribeReply = await pb_grpc.AgentStub(ch).Describe(
            pb.DescribeRequest(), timeout=10
        )
        return reply

    async def set_routes(self, change: overload_steps.Routes) -> None:
        doc = routes_change(self.published(), change, self.members)
        self.gateway.apply_routes(gw_routes.from_doc(doc))

    def on_event(self, kind: str, reason: str, message: str) -> None:
        self.say(f"overload {kind} {reason}: {message}")

    async def run(self, stop: asyncio.Event, lock: asyncio.Lock, interval_s: float) -> None:
        """Tick every `interval_s` under `lock` until `stop`; restore before returning."""
        try:
            while not stop.is_set():
                async with lock:
                    await self.loop.tick()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval_s)
        finally:
            await self.loop.driver.close()
            for ch in self.channels.values():
                await ch.close()


def guarded(
    lock: asyncio.Lock, one_pass: Callable[[Any], Awaitable[bool]]
) -> Callable[[Any], Awaitable[bool]]:
    """`one_pass` that never overlaps a loop tick."""

    async def run(current: Any) -> bool:
        async with lock:
            return await one_pass(current)

    return run
