"""The replica autoscale loop: observe, decide purely, wake or sleep, report.

One `tick` per period for a deployment whose `spec.scaling.enabled`. Observe: each planned
replica's leader (`Describe`: asleep, running and waiting requests, KV pages) and the gateway's
`gateway_demand.Demand`. State is only the hysteresis memory (`autoscale.Memory`), each
replica's last request time, the previous TTFT histogram and channels, so a restarted operator
converges from the leaders. Decide: `policies.autoscale.decide`. Actuate: `WakeReplica`
(concurrently) and `SleepReplica` (an agent refusing a busy replica is not an error); a new
plan count (`Decision.replicas`) is only reported, for the caller to write where the next
reconcile pass reads it. Report: a `Tick` with events, the decision and wake seconds.
Callers: `tessera_operator.autoscale_tick` and `tessera.cli.up_autoscale`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from tessera.control import agents, gateway_demand
from tessera.observability import control
from tessera.policies.scaling import autoscale
from tessera.policies.scaling import signal as sig
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb

DESCRIBE_TIMEOUT_S = 2.0
WAKE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Event:
    kind: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Resize:
    """The plan's side of a tick (`autoscale.Signals`): its replica count (loading ones
    included), the count last asked for (`status.autoscaling.desiredReplicas`) and
    whether the layout is auto (the plan follows the count; explicit: sleep/wake only)."""

    planned: int = 0
    target: int | None = None
    resizable: bool = False


@dataclass
class Tick:
    decision: autoscale.Decision | None = None
    events: list[Event] = field(default_factory=list)
    woke: list[str] = field(default_factory=list)
    slept: list[str] = field(default_factory=list)
    wake_s: list[float] = field(default_factory=list)  # per woken replica, the agent's time
    unreachable: list[str] = field(default_factory=list)
    signals: autoscale.Signals | None = None  # as observed at the tick's start

    @property
    def acted(self) -> bool:
        return bool(self.woke or self.slept)

    def sleeping(self) -> list[str]:
        """The replicas asleep after the tick."""
        was = (
            {r.replica_id for r in self.signals.replicas if not r.awake} if self.signals else set()
        )
        return sorted((was - set(self.woke)) | set(self.slept))


class Leaders:
    """The loop's only I/O (tests replace it), over kept channels (`agents.Channels`: the
    operator's per deployment ones when given, else the loop's own)."""

    def __init__(
        self, channels: agents.Channels | None = None, *, tls: transport.TlsFiles | None
    ) -> None:
        self.channels = channels if channels is not None else agents.Channels(tls)
        self._own_channels = channels is None

    def stub(self, address: str) -> Any:
        return self.channels.stub(address)

    async def describe(self, address: str) -> pb.DescribeReply:
        reply: pb.DescribeReply = await self.stub(address).Describe(
            pb.DescribeRequest(), timeout=DESCRIBE_TIMEOUT_S
        )
        return reply

    async def sleep(self, address: str, replica_id: str) -> pb.SleepReplicaReply:
        reply: pb.SleepReplicaReply = await self.stub(address).SleepReplica(
            pb.SleepReplicaRequest(replica_id=replica_id), timeout=WAKE_TIMEOUT_S
        )
        return reply

    async def wake(self, address: str, replica_id: str) -> pb.WakeReplicaReply:
        reply: pb.WakeReplicaReply = await self.stub(address).WakeReplica(
            pb.WakeReplicaRequest(replica_id=replica_id), timeout=WAKE_TIMEOUT_S
        )
        return reply

    async def close(self) -> None:
        if self._own_channels:
            await self.channels.close()


class AutoscaleLoop:
    """The loop of one deployment; `tick` once per period."""

    def __init__(
        self,
        leaders: Leaders,
        clock: Callable[[], float] = time.monotonic,
        deployment: str = "",
    ) -> None:
        self.leaders = leaders
        self.clock = clock
        self.deployment = deployment
        self.memory = autoscale.Memory()
        self.last_busy: dict[str, float] = {}
        self.started = clock()
        self._ttft: sig.Hist | None = None
        self._asleep: set[str] = set()  # asleep at the last observation
        self.woken_elsewhere: list[str] = []  # woken since, not by this loop (a request)

    async def observe(
        self,
        members: Mapping[str, str],
        demand: gateway_demand.Demand,
        resize: Resize | None = None,
        described: Mapping[str, pb.DescribeReply] | None = None,
    ) -> tuple[autoscale.Signals, list[str]]:
        """Signals from the leaders (`members`: replica id -> leader address); from
        `described` (the replies of the caller's shared observation, by address; a
        leader absent did not answer) when given, else a `Describe` of each leader."""
        now = self.clock()
        addresses = sorted(set(members.values()))
        replies: list[pb.DescribeReply | BaseException]
        if described is not None:
            got = {a: described.get(a) for a in addresses}
            replies = [r if r is not None else LookupError(a) for a, r in got.items()]
        else:
            replies = await asyncio.gather(
                *(self.leaders.describe(a) for a in addresses), return_exceptions=True
            )
        kv: dict[str, pb.ReplicaKV] = {}
        room: dict[str, bool] = {}  # replica -> its leader's host cache can take its blocks
        down: list[str] = []
        for a, r in zip(addresses, replies, strict=True):
            if isinstance(r, BaseException):
                down.append(a)
                continue
            kv.update({k.replica_id: k for k in r.kv})
            free = r.host_cache.budget_bytes - r.host_cache.used_bytes
            for rk in r.kv:
                held = sum(b.param_bytes for b in r.blocks if b.replica_id == rk.replica_id)
                room[rk.replica_id] = r.host_cache.budget_bytes > 0 and free >= held
        loads = []
        for rid in sorted(members):
            k = kv.get(rid)
            if k is None:
                continue  # not loaded yet, or its leader is down: not the loop's to scale
            busy = k.running or k.waiting or rid in demand.busy
            woke = rid in self._asleep and not k.sleeping  # woken since (the gateway's hold)
            if woke:
                self.woken_elsewhere.append(rid)
            if busy or woke or rid not in self.last_busy:
                self.last_busy[rid] = now if busy or woke else self.started
            self._asleep.discard(rid)
            if k.sleeping:
                self._asleep.add(rid)
            used = k.pages_used / k.pages_total if k.pages_total else 0.0
            loads.append(
                autoscale.ReplicaLoad(
                    rid,
                    not k.sleeping,
                    int(k.running),
                    int(k.waiting),
                    used,
                    0.0 if busy else now - self.last_busy[rid],
                    room.get(rid, False),
                )
            )
        p99 = gateway_demand.p99(self._ttft, demand.ttft)
        if demand.ttft is not None:
            self._ttft = demand.ttft
        resize = resize or Resize()
        signals = autoscale.Signals(
            tuple(loads),
            now,
            demand.held,
            demand.queued,
            p99,
            resize.planned,
            resize.target,
            resize.resizable,
        )
        return signals, down

    async def tick(
        self,
        members: Mapping[str, str],
        demand: gateway_demand.Demand,
        cfg: autoscale.AutoscaleConfig,
        resize: Resize | None = None,
        described: Mapping[str, pb.DescribeReply] | None = None,
    ) -> Tick:
        self.woken_elsewhere = []
        signals, down = await self.observe(members, demand, resize, described)
        out = Tick(unreachable=down, signals=signals)
        for rid in self.woken_elsewhere:  # the gateway's hold woke it for a request
            out.events.append(Event("Normal", "ReplicaWoke", f"{rid}: woken by a request"))
        dec = autoscale.decide(signals, cfg, self.memory)
        self.memory = dec.memory
        out.decision = dec
        if not dec.acted:
            return out
        head = f"{dec.reason}: {dec.message}; awake {dec.awake} -> {dec.desired}"
        out.events.append(Event("Normal", dec.reason, head))
        if dec.replicas is not None:  # the next reconcile pass plans that many
            what = f"plan {signals.plan_count} -> {dec.replicas} replicas"
            out.events.append(Event("Normal", "ReplicasResized", f"{dec.reason}: {what}"))
        with control.action("autoscale", dec.reason, deployment=self.deployment):
            await asyncio.gather(*(self._wake(members[r], r, out) for r in dec.wake))
            for r in dec.sleep:
                await self._sleep(members[r], r, out)
        return out

    async def _wake(self, address: str, rid: str, out: Tick) -> None:
        t0 = self.clock()
        try:
            reply = await self.leaders.wake(address, rid)
        except grpc.aio.AioRpcError as exc:
            out.events.append(Event("Warning", "WakeFailed", f"{rid}: {exc.code().name} "
                                    f"{exc.details()}"))  # fmt: skip
            return
        self.last_busy[rid] = self.clock()  # a woken replica starts its idle time afresh
        self._asleep.discard(rid)  # this loop woke it: no "woken by a request" event
        out.woke.append(rid)
        out.wake_s.append(reply.seconds)
        out.events.append(
            Event(
                "Normal",
                "ReplicaWoke",
                f"{rid}: {reply.restored_bytes} bytes restored in {reply.seconds:.3f}s "
                f"(asked {self.clock() - t0:.3f}s)",
            )
        )

    async def _sleep(self, address: str, rid: str, out: Tick) -> None:
        try:
            reply = await self.leaders.sleep(address, rid)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                return  # it had a request by then: the next tick looks again
            out.events.append(Event("Warning", "SleepFailed", f"{rid}: {exc.code().name} "
                                    f"{exc.details()}"))  # fmt: skip
            return
        out.slept.append(rid)
        self._asleep.add(rid)
        out.events.append(
            Event(
                "Normal",
                "ReplicaSlept",
                f"{rid}: {reply.offloaded_bytes} bytes to the host cache, "
                f"{reply.released_kv_bytes} KV bytes released in {reply.seconds:.3f}s",
            )
        )

    async def close(self) -> None:
        await self.leaders.close()
