"""Sleep and wake of the replicas an agent hosts (issue 32): `SleepReplica` / `WakeReplica`.

A replica sleeps when it is idle (the autoscaler, `tessera.control.autoscale_loop`, asks
its leader): every block of it held here moves to the host block cache and its KV pool is
released (`hosting.offload`, warmcache's pair); the blocks are remembered, reported by
Describe as still held (so a reconcile sees no drift) and the leader's `ReplicaKV` says
`sleeping` (so the gateway routes nothing to it and holds requests instead). Waking
restores them (`hosting.restore`: from the host cache first). A stage on another agent
(the `next_address` of a block here) is put to sleep after, and woken before, the stages
here, through that agent's own RPC, so asking the leader is enough. A sleep is refused
(FAILED_PRECONDITION) while the replica has requests; a `Generate` for a sleeping replica
wakes it first (`awake`), so a request routed just before the sleep is not lost.
Owned by the servicer (one per agent), which only translates protos.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tessera import blocks
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import hosting
from tessera_agent.engine import errors

log = logging.getLogger(__name__)

PEER_TIMEOUT_S = 300.0  # a peer's whole sleep or wake of its stages


@dataclass(frozen=True)
class Slept:
    """One block asleep: its load spec (restored as is) and the bytes it held."""

    spec: blocks.Block
    param_bytes: int
    kv_bytes: int
    kv_pages: int  # the pool it had: reported unchanged, so a reconcile sees no drift

    def observed(self) -> blocks.Block:
        """As Describe reports it: as held before the sleep (it comes back the same)."""
        return dataclasses.replace(self.spec, param_bytes=self.param_bytes, kv_bytes=self.kv_bytes)


@dataclass(frozen=True)
class Outcome:
    changed: bool  # False: it already slept (or was awake)
    param_bytes: int
    kv_bytes: int
    seconds: float


class Sleepers:
    """The replicas asleep on this agent, and the sleep/wake operations."""

    def __init__(
        self,
        host: hosting.Hosting,
        self_address: Callable[[], str] = lambda: "",
        on_change: Callable[[str, str, float], None] | None = None,
    ) -> None:
        self.host = host
        self._self = self_address  # this agent's own address (a stage here needs no call)
        self._on_change = on_change  # (replica, "sleep"|"wake", seconds): metrics
        self.asleep: dict[str, list[Slept]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, replica_id: str) -> asyncio.Lock:
        return self._locks.setdefault(replica_id, asyncio.Lock())

    def _held(self, replica_id: str) -> list[blocks.Block]:
        return [
            self.host.observed(h)
            for (rid, _), h in sorted(self.host.hosted.items())
            if rid == replica_id
        ]

    def _peers(self, specs: list[blocks.Block]) -> list[str]:
        """Addresses of the next stages held by other agents."""
        here = {(b.replica_id, b.stage_index) for b in specs}
        out = []
        for b in specs:
            nxt = (b.replica_id, b.stage_index + 1)
            if b.next_address and nxt not in here and b.next_address != self._self():
                out.append(b.next_address)
        return sorted(set(out))

    async def sleep(self, replica_id: str) -> Outcome:
        async with self._lock(replica_id):
            if replica_id in self.asleep:
                return Outcome(False, 0, 0, 0.0)
            held = self._held(replica_id)
            pages = {
                k: h.stage.num_pages for k, h in self.host.hosted.items() if k[0] == replica_id
            }
            if not held:
                raise errors.NotFoundError(f"replica {replica_id!r} has no block on this agent")
            lead = self.host.hosted.get((replica_id, 0))
            if lead is not None and lead.leader is not None and lead.leader.num_unfinished:
                raise errors.FailedPreconditionError(
                    f"replica {replica_id} has {lead.leader.num_unfinished} requests; it "
                    "sleeps only when idle"
                )
            t0 = time.perf_counter()
            specs = await self.host.offload(replica_id)
            by_key = {(b.replica_id, b.stage_index): b for b in held}
            self.asleep[replica_id] = [
                _slept(s, by_key.get(s.key[:2]), pages.get(s.key[:2], 0)) for s in specs
            ]
            for address in self._peers(specs):
                await _call(
                    address,
                    "SleepReplica",
                    pb.SleepReplicaRequest(replica_id=replica_id),
                    self.host.defaults.tls,
                )
            seconds = time.perf_counter() - t0
            self._changed(replica_id, "sleep", seconds)
            return Outcome(
                True, sum(b.param_bytes for b in held), sum(b.kv_bytes for b in held), seconds
            )

    async def wake(self, replica_id: str) -> Outcome:
        async with self._lock(replica_id):
            slept = self.asleep.get(replica_id)
            if slept is None:
                return Outcome(False, 0, 0, 0.0)
            t0 = time.perf_counter()
            specs = [b.spec for b in slept]
            for address in self._peers(specs):  # downstream first: the leader connects to it
                await _call(
                    address,
                    "WakeReplica",
                    pb.WakeReplicaRequest(replica_id=replica_id),
                    self.host.defaults.tls,
                )
            await self.host.restore(specs)
            del self.asleep[replica_id]
            seconds = time.perf_counter() - t0
            self._changed(replica_id, "wake", seconds)
            return Outcome(True, sum(b.param_bytes for b in slept), 0, seconds)

    async def awake(self, replica_id: str) -> None:
        """Wake `replica_id` when it sleeps here (a request for it arrived)."""
        if replica_id in self.asleep:
            log.info("a request for sleeping replica %s wakes it", replica_id)
            await self.wake(replica_id)

    def forget(self, replica_id: str, stage_index: int) -> bool:
        """An unload of a sleeping block: drop it from the sleepers (nothing is loaded)."""
        specs = self.asleep.get(replica_id)
        if specs is None:
            return False
        left = [b for b in specs if b.spec.stage_index != stage_index]
        if len(left) == len(specs):
            return False
        if left:
            self.asleep[replica_id] = left
        else:
            del self.asleep[replica_id]
        return True

    def blocks(self) -> list[tuple[blocks.Block, int]]:
        """The sleeping blocks as Describe reports them, with their KV pages."""
        return [(b.observed(), b.kv_pages) for slept in self.asleep.values() for b in slept]

    def leading(self) -> list[str]:
        """Sleeping replicas whose stage 0 is here (Describe lists them as sleeping)."""
        return sorted(r for r, s in self.asleep.items() if any(not b.spec.stage_index for b in s))

    def _changed(self, replica_id: str, what: str, seconds: float) -> None:
        log.info("replica %s: %s in %.3fs", replica_id, what, seconds)
        if self._on_change is not None:
            self._on_change(replica_id, what, seconds)


def _slept(spec: blocks.Block, held: blocks.Block | None, pages: int) -> Slept:
    return Slept(spec, held.param_bytes if held else 0, held.kv_bytes if held else 0, pages)


async def _call(address: str, method: str, request: Any, tls: transport.TlsFiles | None) -> None:
    channel = transport.channel(address, tls)
    try:
        stub = pb_grpc.AgentStub(channel)
        await getattr(stub, method)(request, timeout=PEER_TIMEOUT_S)
    finally:
        await channel.close()
