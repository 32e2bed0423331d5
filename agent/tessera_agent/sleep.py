"""Sleep and wake of the replicas an agent hosts: `SleepReplica` / `WakeReplica`.

Asked of a replica's leader by the autoscaler (`tessera.control.autoscale_loop`). Sleep moves
every block held here to the host block cache (TP ranks' slices to `sleep_shards`) and
releases the KV pool; Describe still reports the blocks (no drift) and `ReplicaKV` says
`sleeping`, so the gateway holds requests. Wake restores them from host memory first. Stages
on other agents sleep after, and wake before, the ones here through their own RPC; a TP
stage with a rank elsewhere is refused, as is a sleep while requests run (FAILED_PRECONDITION).
A `Generate` for a sleeping replica wakes it first. Owned by the servicer (one per agent).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tessera import blocks
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import hosted, hosting
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
        """Every rank of every stage of the replica held here, as held."""
        return sorted((hosted.observed(h) for h in self.host.ranks(replica_id)),
                      key=lambda b: b.key)  # fmt: skip

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
            pages = {h.stage.spec.key: h.stage.num_pages for h in self.host.ranks(replica_id)}
            if not held:
                raise errors.NotFoundError(f"replica {replica_id!r} has no block on this agent")
            lead = self.host.hosted.get((replica_id, 0))
            if lead is not None and lead.leader is not None and lead.leader.num_unfinished:
                raise errors.FailedPreconditionError(
                    f"replica {replica_id} has {lead.leader.num_unfinished} requests; it "
                    "sleeps only when idle"
                )
            t0 = time.perf_counter()
            specs = await offload(self.host, replica_id)
            by_key = {b.key: b for b in held}
            self.asleep[replica_id] = [
                _slept(s, by_key.get(s.key), pages.get(s.key, 0)) for s in specs
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
            await restore(self.host, specs)
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
        self.host.shards.drop(replica_id, stage_index)  # a TP rank's kept slices
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


# -- the blocks' side: to the host cache and back -------------------------------------
async def offload(host: hosting.Hosting, replica_id: str) -> list[blocks.Block]:
    """Unload every block (every rank) of `replica_id` held here, leaving their pieces
    in the host cache (a TP rank's slices in `shards`) and releasing their KV pools;
    returns the blocks, for `restore`. A TP stage with a rank on another agent is
    refused (its group would be left without this rank)."""
    ranks = host.ranks(replica_id)
    for h in ranks:
        spec = h.stage.spec
        here = sum(1 for o in ranks if o.stage.spec.stage_index == spec.stage_index)
        if spec.tp_size > here:
            raise errors.FailedPreconditionError(
                f"replica {replica_id} stage {spec.stage_index}: {here} of its "
                f"{spec.tp_size} TP ranks are on agent {host.agent_id}; a replica sleeps "
                "only with every rank of its TP stages on one agent"
            )
    specs = sorted((h.stage.spec for h in ranks), key=lambda b: (-b.stage_index, b.tp_rank))
    loop = asyncio.get_running_loop()
    for h in ranks:
        if h.stage.spec.tp_size > 1:
            await loop.run_in_executor(
                host.loader, host.shards.park, h.stage, h.data_plane, host._host_copy
            )
    for stage_index in sorted({b.stage_index for b in specs}, reverse=True):
        await host.unload(replica_id, stage_index)
    return specs


async def restore(host: hosting.Hosting, specs: Sequence[blocks.Block]) -> list[hosting.Loaded]:
    """Load blocks again (as `offload` returned them), from the host cache as far as
    it still holds them (a TP rank from its kept slices, in a group named afresh),
    storage for the rest; last stage first, ranks in order."""
    host.shards.wakes += 1
    planes: dict[int, pb.DataPlane | None] = {}  # one new group per stage
    out = []
    for b in sorted(specs, key=lambda b: (-b.stage_index, b.tp_rank)):
        parked = host.shards.take(b.key)
        if parked is None:
            out.append(await host.load(b))
            continue
        if b.stage_index not in planes:
            planes[b.stage_index] = host.shards.renamed(parked.data_plane)
        dp = planes[b.stage_index]
        out.append(await host.load(b, data_plane=dp, kept=parked.tensors))
    return out
