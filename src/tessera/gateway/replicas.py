"""The replicas the gateway routes to, their gRPC channels, and whether each is ready.

A replica is reached through its leader agent. `poll_once` calls every leader's
`Describe` (driven every `poll_interval_s` by `server.py`); a replica is ready iff its
leader answered and listed it in `kv`, reports no tensor-parallel group of it failed (a
dead rank: not ready, with the group's reason, until it is reloaded), and it has not
failed a request within the last `failure_backoff_s` (`mark_failed`, called by
`dispatch.py`). `update` swaps the replica
list at run time (routes file, `GatewayHandle.update_replicas`); channels to leaders no
longer used close once their running calls end. `generate` starts a request on a replica:
on its multiplexed stream (`mux.py`, retired when the replica is removed, moves or is
marked failed) or, with `generate_mux` off, as one `Generate` call. A replica its leader
lists as `sleeping` (issue 32) is not ready ("sleeping"); `wake_sleeping` asks the
leaders to wake them (`hold.py` calls it when a request waits for a replica).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tessera.gateway import config, metrics, mux
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

CHANNEL_CLOSE_GRACE_S = 600.0  # a retired channel waits this long for its running calls
WAKE_TIMEOUT_S = 120.0  # a WakeReplica restores every block of the replica


NOT_POLLED = "not polled yet"


@dataclass
class ReplicaState:
    """What the gateway knows about one replica."""

    endpoint: config.ReplicaEndpoint
    ready: bool = False
    detail: str = NOT_POLLED  # why it is not ready, or "ok"
    pages_total: int = 0
    pages_used: int = 0
    running: int = 0
    waiting: int = 0
    max_num_seqs: int = 0  # the leader's batch limit now (0: not reported)
    page_size: int = 0  # tokens per KV page of its leader stage (0: not reported)
    backoff_until: float = 0.0  # monotonic time before which it stays not ready
    sleeping: bool = False  # its leader reports it asleep (issue 32)

    def to_json(self) -> dict[str, Any]:
        return {
            "address": self.endpoint.address,
            "ready": self.ready,
            "detail": self.detail,
            "kv_pages_total": self.pages_total,
            "kv_pages_used": self.pages_used,
            "running": self.running,
            "waiting": self.waiting,
            "sleeping": self.sleeping,
        }


class ReplicaSet:
    """Replica states plus one channel (and stub) per leader address."""

    def __init__(
        self,
        gauges: metrics.GatewayMetrics,
        poll_timeout_s: float = 2.0,
        failure_backoff_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
        generate_mux: bool = False,  # the gateway passes GatewayConfig.generate_mux
        *,
        tls: transport.TlsFiles | None,  # GatewayConfig.tls: every channel to the agents
    ) -> None:
        self.tls = tls
        self.mux = mux.MuxPool() if generate_mux else None
        self._metrics = gauges
        self._timeout = poll_timeout_s
        self._backoff = failure_backoff_s
        self._clock = clock
        self._states: dict[str, ReplicaState] = {}
        self._stubs: dict[str, tuple[grpc.aio.Channel, Any]] = {}
        self._retiring: dict[asyncio.Task[None], grpc.aio.Channel] = {}
        self.closed: frozenset[str] = frozenset()  # the routes' closed replicas (routes.py)

    # -- membership ---------------------------------------------------------------------
    def update(self, endpoints: Sequence[config.ReplicaEndpoint]) -> None:
        """Replace the replica list; unchanged replicas keep their readiness."""
        new: dict[str, ReplicaState] = {}
        for ep in endpoints:
            old = self._states.get(ep.replica_id)
            new[ep.replica_id] = old if old is not None and old.endpoint == ep else ReplicaState(ep)
        for rid in self._states.keys() - new.keys():
            with contextlib.suppress(KeyError):
                self._metrics.ready.remove(rid)
        for rid, st in self._states.items():
            if self.mux is not None and new.get(rid) is not st:  # removed or moved
                self.mux.drop(rid)
        self._states = new
        for rid, st in new.items():
            self._metrics.ready.labels(rid).set(1 if st.ready else 0)
        used = {st.endpoint.address for st in new.values()}
        for address in list(self._stubs.keys() - used):
            channel, _ = self._stubs.pop(address)
            task = asyncio.get_running_loop().create_task(
                channel.close(grace=CHANNEL_CLOSE_GRACE_S)
            )
            self._retiring[task] = channel
            task.add_done_callback(lambda t: self._retiring.pop(t, None))

    @property
    def endpoints(self) -> list[config.ReplicaEndpoint]:
        return [st.endpoint for st in self._states.values()]

    def ready_ids(self) -> list[str]:
        return [rid for rid, st in self._states.items() if st.ready]

    def room_ids(self) -> list[str]:
        """Ready replicas with free KV pages and no queue, as their leaders last said."""
        return [
            rid
            for rid, st in self._states.items()
            if st.ready and st.waiting == 0 and st.pages_used < st.pages_total
        ]

    def unpolled(self) -> bool:
        """Whether some replica has never been polled (named by a cut-over just now)."""
        return any(st.detail == NOT_POLLED for st in self._states.values())

    def sleeping_ids(self) -> list[str]:
        return [rid for rid, st in self._states.items() if st.sleeping]

    async def wake_sleeping(self) -> None:
        """Ask every sleeping replica's leader to wake it (concurrently); a failure is
        logged (the poll and the hold's deadline say the rest)."""

        async def wake(rid: str) -> None:
            try:
                await self.stub(rid).WakeReplica(
                    pb.WakeReplicaRequest(replica_id=rid), timeout=WAKE_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as exc:
                log.warning("waking %s failed: %s %s", rid, exc.code().name, exc.details())

        await asyncio.gather(*(wake(rid) for rid in self.sleeping_ids()))

    def states(self) -> dict[str, ReplicaState]:
        return dict(self._states)

    def stub(self, replica_id: str) -> Any:
        """The agent stub of the replica's leader (its channel is made on first use)."""
        address = self._states[replica_id].endpoint.address
        if address not in self._stubs:
            channel = transport.channel(address, self.tls)
            self._stubs[address] = (channel, pb_grpc.AgentStub(channel))
        return self._stubs[address][1]

    def generate(self, replica_id: str, request: pb.GenerateRequest) -> Any:
        """Start `request` on the replica: a `mux.MuxCall` on its stream, or (mux off) a
        per-request `Generate` call; both iterate chunks and have `cancel()`."""
        stub = self.stub(replica_id)
        if self.mux is None:
            return stub.Generate(request)
        return self.mux.call(replica_id, stub, request)

    # -- readiness ----------------------------------------------------------------------
    def mark_failed(self, replica_id: str, detail: str) -> None:
        """A request failed on this replica: not ready for `failure_backoff_s`."""
        st = self._states.get(replica_id)
        if st is None:
            return
        st.ready, st.detail = False, f"failed a request: {detail}"
        st.backoff_until = self._clock() + self._backoff
        self._metrics.ready.labels(replica_id).set(0)
        if self.mux is not None:
            self.mux.drop(replica_id)

    async def poll_once(self) -> None:
        """Describe every leader once (concurrently) and update readiness."""
        by_address: dict[str, list[ReplicaState]] = {}
        for st in self._states.values():
            by_address.setdefault(st.endpoint.address, []).append(st)
        await asyncio.gather(*(self._poll(a, sts) for a, sts in by_address.items()))

    async def _poll(self, address: str, states: list[ReplicaState]) -> None:
        stub = self.stub(states[0].endpoint.replica_id)
        try:
            reply: pb.DescribeReply = await stub.Describe(
                pb.DescribeRequest(), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            for st in states:
                self._set(st, False, f"Describe failed: {exc.code().name} {exc.details()}")
            return
        kv = {r.replica_id: r for r in reply.kv}
        pages = {b.replica_id: b.page_size for b in reply.blocks if b.stage_index == 0}
        broken = {b.replica_id: b.group_reason for b in reply.blocks if b.group_state == "failed"}
        now = self._clock()
        for st in states:
            r = kv.get(st.endpoint.replica_id)
            if r is None:
                st.sleeping = False
                self._set(st, False, f"agent {reply.agent_id} at {address} does not lead it")
                continue
            st.pages_total, st.pages_used = r.pages_total, r.pages_used
            st.running, st.waiting = r.running, r.waiting
            st.max_num_seqs = r.max_num_seqs
            st.page_size = pages.get(st.endpoint.replica_id, 0)
            st.sleeping = r.sleeping
            if r.sleeping:
                self._set(st, False, "sleeping")
            elif st.endpoint.replica_id in broken:
                why = broken[st.endpoint.replica_id] or "a rank is gone"
                self._set(st, False, f"group failed on its leader: {why}")
            elif now < st.backoff_until:
                self._set(st, False, st.detail)
            else:
                self._set(st, True, "ok")

    def _set(self, st: ReplicaState, ready: bool, detail: str) -> None:
        if st.ready != ready:
            log.info(
                "replica %s %s: %s",
                st.endpoint.replica_id,
                "ready" if ready else "not ready",
                detail,
            )
        st.ready, st.detail = ready, detail
        if self._states.get(st.endpoint.replica_id) is st:
            self._metrics.ready.labels(st.endpoint.replica_id).set(1 if ready else 0)

    async def close(self) -> None:
        """Close every channel now (running calls are cancelled)."""
        if self.mux is not None:
            await self.mux.close()
        retiring, self._retiring = self._retiring, {}
        for task in retiring:
            task.cancel()
        await asyncio.gather(*retiring, return_exceptions=True)
        channels = [c for c, _ in self._stubs.values()] + list(retiring.values())
        self._stubs.clear()
        for c in channels:
            await c.close()
