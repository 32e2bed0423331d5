"""The autoscale loop (issue 32, `control/autoscale_loop.py`) over fake leaders: demand at
zero wakes a replica (event ReplicaWoke), idle replicas sleep (ScaleToZero), a replica
woken by the gateway starts its idle time afresh, a sleep refused for a request is not an
error; and the window p99 of the TTFT histogram (`gateway_demand.p99`)."""

from __future__ import annotations

import math

import grpc

from tessera.control import autoscale_loop, gateway_demand
from tessera.policies.scaling import autoscale
from tessera.policies.scaling import signal as sig
from tessera.rpc.v1 import agent_pb2 as pb


class FakeLeaders(autoscale_loop.Leaders):
    def __init__(self, replicas: list[str]) -> None:
        super().__init__(tls=None)
        self.asleep = set(replicas)
        self.replicas = replicas
        self.busy: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    async def describe(self, address: str) -> pb.DescribeReply:
        kv = [
            pb.ReplicaKV(replica_id=r, sleeping=r in self.asleep, pages_total=10,
                         running=int(r in self.busy))
            for r in self.replicas
        ]  # fmt: skip
        return pb.DescribeReply(agent_id=address, kv=kv)

    async def wake(self, address: str, replica_id: str) -> pb.WakeReplicaReply:
        self.calls.append(("wake", replica_id))
        self.asleep.discard(replica_id)
        return pb.WakeReplicaReply(awake=True, seconds=0.01, restored_bytes=5)

    async def sleep(self, address: str, replica_id: str) -> pb.SleepReplicaReply:
        self.calls.append(("sleep", replica_id))
        if replica_id in self.busy:
            raise _Refused()
        self.asleep.add(replica_id)
        return pb.SleepReplicaReply(sleeping=True, offloaded_bytes=5)


class _Refused(grpc.aio.AioRpcError):
    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.FAILED_PRECONDITION, None, None, "busy")  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


CFG = autoscale.AutoscaleConfig(enabled=True, min_replicas=0, sleep_after_s=10)
MEMBERS = {"r0": "a:1", "r1": "b:1"}


async def test_from_zero_then_idle_to_zero() -> None:
    leaders, clock = FakeLeaders(["r0", "r1"]), Clock()
    loop = autoscale_loop.AutoscaleLoop(leaders, clock)
    out = await loop.tick(MEMBERS, gateway_demand.Demand(held=1), CFG)
    assert out.woke == ["r0"] and out.wake_s == [0.01]
    assert [e.reason for e in out.events] == [autoscale.FROM_ZERO, "ReplicaWoke"]
    clock.t = 5.0
    out = await loop.tick(MEMBERS, gateway_demand.Demand(), CFG)
    assert not out.acted  # idle 5 s < 10 s
    clock.t = 16.0
    out = await loop.tick(MEMBERS, gateway_demand.Demand(), CFG)
    assert out.slept == ["r0"] and out.events[0].reason == autoscale.TO_ZERO
    assert leaders.asleep == {"r0", "r1"}


async def test_woken_by_the_gateway_starts_idle_afresh_and_a_refusal_is_quiet() -> None:
    leaders, clock = FakeLeaders(["r0"]), Clock()
    loop = autoscale_loop.AutoscaleLoop(leaders, clock)
    await loop.tick({"r0": "a:1"}, gateway_demand.Demand(), CFG)  # asleep, no demand
    clock.t = 100.0
    leaders.asleep.clear()  # the gateway's hold woke it
    out = await loop.tick({"r0": "a:1"}, gateway_demand.Demand(), CFG)
    assert not out.acted  # idle since it woke, not since the start
    assert [(e.reason, e.message) for e in out.events] == [
        ("ReplicaWoke", "r0: woken by a request")
    ]
    clock.t = 111.0
    leaders.busy.add("r0")  # a request came between the observation and the sleep
    loop.last_busy["r0"] = 0.0
    sig_ = await loop.observe({"r0": "a:1"}, gateway_demand.Demand())
    assert sig_[0].replicas[0].running == 1
    leaders.busy.clear()
    clock.t = 200.0
    leaders.busy.add("r0")
    out = autoscale_loop.Tick()
    await loop._sleep("a:1", "r0", out)
    assert not out.slept and not out.events  # refused: not an error


def test_window_p99() -> None:
    bounds = (0.1, 0.5, 1.0, math.inf)
    a = sig.Hist(bounds, (0, 0, 0, 0), 0, 0)
    b = sig.Hist(bounds, (50, 99, 100, 100), 100, 10)
    p = gateway_demand.p99(a, b)
    assert p is not None and 0.1 < p <= 0.5
    late = sig.Hist(bounds, (50, 99, 100, 200), 200, 10)
    assert gateway_demand.p99(b, late) == 1.0  # past the largest finite bound
    assert gateway_demand.p99(b, b) is None and gateway_demand.p99(None, None) is None


def test_demand_from_calls() -> None:
    from tessera.control import gateway_load

    calls = {"r0": (gateway_load.Call(3, 4, False), gateway_load.Call(3, 4, True)), "r1": ()}
    d = gateway_demand.from_calls(calls, 2, None)
    assert (d.held, d.queued, d.busy) == (2, 1, frozenset({"r0"}))


class CachedLeaders(FakeLeaders):
    """Every replica awake; the host cache's free bytes and each replica's blocks given."""

    def __init__(self, replicas: list[str], free: int, budget: int = 100) -> None:
        super().__init__(replicas)
        self.asleep = set()
        self.free, self.budget = free, budget

    async def describe(self, address: str) -> pb.DescribeReply:
        reply = await super().describe(address)
        reply.blocks.extend(pb.BlockInfo(replica_id=r, param_bytes=40) for r in self.replicas)
        reply.host_cache.budget_bytes = self.budget
        reply.host_cache.used_bytes = self.budget - self.free
        return reply


async def test_no_host_cache_room_shrinks_the_plan_instead_of_sleeping() -> None:
    cfg = autoscale.AutoscaleConfig(enabled=True, min_replicas=1, max_replicas=2,
                                    scale_down_after_s=1)  # fmt: skip
    resize = autoscale_loop.Resize(planned=2, target=None, resizable=True)
    for free, budget, sleeps in ((10, 100, False), (100, 0, False), (50, 100, True)):
        leaders, clock = CachedLeaders(["r0", "r1"], free, budget), Clock()
        loop = autoscale_loop.AutoscaleLoop(leaders, clock)
        await loop.tick(MEMBERS, gateway_demand.Demand(), cfg, resize)  # calm starts
        clock.t = 5.0
        out = await loop.tick(MEMBERS, gateway_demand.Demand(), cfg, resize)
        assert out.decision is not None and out.decision.reason == autoscale.IN
        if sleeps:  # 50 free >= 40 bytes: sleep, the plan unchanged
            assert out.slept and out.decision.replicas is None
        else:
            assert not out.slept and out.decision.replicas == 1
            assert "ReplicasResized" in [e.reason for e in out.events]
