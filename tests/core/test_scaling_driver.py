"""The scaling driver applies the pure policy's decisions as agent operations.

A fake agent stub records the requests: scale-up replicates aligned runs onto the idle
peer (nothing while the peer is busy); scale-down migrates the origin's layers as runs
to the idle peer, in Algorithm 2's order, and with no idle peer cuts the leader's batch
(`ScalingBatchLimit`) until `restore_batch` lifts it; evict_all evicts every replica; gamma is
measured from the runs' speeds and then refuses replication.
"""

from __future__ import annotations

from typing import Any

import pytest

from tessera.control import agents
from tessera.control import scaling_driver as sd
from tessera.policies.scaling import module_scaling as ms
from tessera.rpc.v1 import agent_pb2 as pb


class FakeAgent:
    def __init__(self, describe: pb.DescribeReply) -> None:
        self.describe = describe
        self.calls: list[tuple[str, pb.ScalingOpRequest]] = []

    def Describe(self, req: Any, timeout: float = 0) -> pb.DescribeReply:
        return self.describe

    def _op(self, kind: str, req: pb.ScalingOpRequest) -> pb.ScalingOpReply:
        self.calls.append((kind, req))
        return pb.ScalingOpReply(op=kind, layer_start=req.layer_start, layer_end=req.layer_end)

    def ScalingReplicate(self, req: pb.ScalingOpRequest, timeout: float = 0) -> pb.ScalingOpReply:
        return self._op("replicate", req)

    def ScalingMigrate(self, req: pb.ScalingOpRequest, timeout: float = 0) -> pb.ScalingOpReply:
        return self._op("migrate", req)

    def ScalingEvict(self, req: pb.ScalingOpRequest, timeout: float = 0) -> pb.ScalingOpReply:
        return self._op("evict", req)

    def ScalingBatchLimit(
        self, req: pb.ScalingBatchLimitRequest, timeout: float = 0
    ) -> pb.ScalingBatchLimitReply:
        self.calls.append(("batch", req))  # type: ignore[arg-type]
        return pb.ScalingBatchLimitReply(max_num_seqs=req.max_num_seqs)


def _dev(free: int) -> pb.Device:
    return pb.Device(id="cpu:0", kind="cpu", capacity_bytes=free, free_bytes=free)


def _driver(
    busy_peer: bool = False, runs: list[pb.ScalingRunInfo] | None = None
) -> tuple[sd.ScalingDriver, FakeAgent, FakeAgent]:
    origin = FakeAgent(
        pb.DescribeReply(
            devices=[_dev(0)],
            kv=[pb.ReplicaKV(replica_id="r0", running=4)],
            scaling_runs=runs or [],
        )
    )
    peer = FakeAgent(
        pb.DescribeReply(
            devices=[_dev(64 << 20)],
            kv=[pb.ReplicaKV(replica_id="x", running=1 if busy_peer else 0)],
        )
    )
    d = sd.ScalingDriver(
        channels=agents.Channels(None),
        origin=sd.Peer("a0", "a0:1"),
        replica_id="r0",
        num_layers=8,
        hidden=256,
        peers=[sd.Peer("a1", "a1:1")],
        cfg=ms.ScalingConfig(enabled=True),
        replica_bytes=4 << 20,
    )
    stubs = {"a0:1": origin, "a1:1": peer}
    d._stub = lambda address: stubs[address]  # type: ignore[method-assign, assignment, return-value]
    return d, origin, peer


def test_scale_up_replicates_aligned_runs_onto_the_idle_peer() -> None:
    d, origin, _ = _driver()
    plan = d.tick_up(batch=4)
    assert plan.actions and plan.speedup_after > 1.0
    kinds = [(k, r.layer_start, r.layer_end, r.target_address) for k, r in origin.calls]
    assert kinds == [("replicate", 0, 8, "a1:1")]  # 8 layers fit 64 MiB at 4 MiB each
    assert origin.calls[0][1].self_address == "a0:1"
    d2, origin2, _ = _driver(busy_peer=True)
    assert d2.tick_up(batch=4).actions == () and origin2.calls == []


def test_scale_down_migrates_runs_to_the_idle_peer_first() -> None:
    d, origin, _ = _driver()
    plan, ops = d.tick_down(
        violation_rate=0.5, step_seconds=0.08, step_budget_s=0.05, layer_bytes=3 << 20, batch=8
    )
    assert plan.phase == "migrate" and plan.resolved
    assert [o.op for o in ops] == ["migrate"] and ops[0].holder == "a0/cpu:0"
    moved = sum(r.layer_end - r.layer_start for _, r in origin.calls)
    assert [k for k, _ in origin.calls] == ["migrate"] and 3 <= moved <= 4
    d3, origin3, _ = _driver()
    plan, ops = d3.tick_down(0.01, 0.08, 0.05, 3 << 20, 8)  # within the threshold
    assert plan.phase == "none" and ops == [] and origin3.calls == []


def test_gamma_measured_from_speeds_then_refuses_and_evict_all() -> None:
    run = pb.ScalingRunInfo(
        replica_id="r0",
        layer_start=0,
        layer_end=8,
        holders=[
            pb.ScalingHolderInfo(name="a0/cpu:0", tokens_per_s=200.0, home=True),
            pb.ScalingHolderInfo(name="a1/cpu:0", tokens_per_s=50.0),
        ],
    )
    d, origin, _ = _driver(runs=[run])
    assert d.measure_gamma() == pytest.approx(3.0)  # (1/50 - 1/200) / (1/200)
    assert d.tick_up(batch=4).actions == ()  # the round trip costs more than it saves
    assert d.evict_all() == 1
    assert [(k, r.holder) for k, r in origin.calls] == [("evict", "a1/cpu:0")]


def test_scale_down_without_an_idle_peer_cuts_the_batch_then_restores() -> None:
    d, origin, _ = _driver(busy_peer=True)
    plan, ops = d.tick_down(
        0.5, step_seconds=0.08, step_budget_s=0.05, layer_bytes=3 << 20, batch=20
    )
    assert plan.phase == "reduce" and ops == [] and plan.batch_size == 10  # 20 -> 15 -> 10
    assert [(k, r.replica_id, r.max_num_seqs) for k, r in origin.calls] == [("batch", "r0", 10)]
    assert d.batch_cap == 10
    assert d.restore_batch() and d.batch_cap is None
    assert origin.calls[-1][1].max_num_seqs == 0  # 0 = the loaded limit
    assert not d.restore_batch() and len(origin.calls) == 2


def test_scale_down_evicts_another_replicas_layers_from_the_violating_device() -> None:
    # r1 (origin a1) replicated all its layers onto a0, where r0 now violates its SLO and
    # no peer is idle to migrate to: phase 2 evicts r1's run from a0 through r1's driver.
    d, origin, peer = _driver(busy_peer=True)
    owner = sd.ScalingDriver(
        channels=agents.Channels(None),
        origin=sd.Peer("a1", "a1:1"),
        replica_id="r1",
        num_layers=8,
        hidden=256,
        peers=[sd.Peer("a0", "a0:1")],
        cfg=ms.ScalingConfig(enabled=True),
        replica_bytes=4 << 20,
    )
    owner._stub = d._stub  # type: ignore[method-assign]
    for i in range(8):
        owner.state = owner.state.add(i, "a0/cpu:0")
    peer.describe.scaling_runs.append(
        pb.ScalingRunInfo(
            replica_id="r1",
            layer_start=0,
            layer_end=8,
            holders=[
                pb.ScalingHolderInfo(name="a1/cpu:0", home=True),
                pb.ScalingHolderInfo(name="a0/cpu:0"),
            ],
        )
    )
    hosted, own = owner.hosted_on("a0/cpu:0", step_seconds=0.08, batch=8)
    assert len(hosted) == 8
    plan, ops = d.tick_down(
        0.5,
        step_seconds=0.08,
        step_budget_s=0.05,
        layer_bytes=3 << 20,
        batch=8,
        hosted=hosted,
        owners={"r1": own},
        evict=lambda a: owner.evict_on(a.layer, a.device),
    )
    assert plan.phase == "evict" and plan.resolved
    assert [(k, r.replica_id, r.holder, r.layer_start, r.layer_end) for k, r in peer.calls] == [
        ("evict", "r1", "a0/cpu:0", 0, 8)  # the whole run, once
    ]
    assert [o.op for o in ops] == ["evict"] and origin.calls == []
    assert owner.state.degrees == (1,) * 8  # r1 no longer counts a replica on a0
    assert owner.hosted_on("a0/cpu:0", 0.08, 8)[0] == []


def test_adopt_takes_the_runs_the_origin_reports() -> None:
    """A new driver (a restarted operator's) starts from the runs on the agents."""
    reply = pb.DescribeReply(
        scaling_runs=[
            pb.ScalingRunInfo(
                replica_id="r0",
                stage_index=0,
                layer_start=0,
                layer_end=2,
                holders=[
                    pb.ScalingHolderInfo(name="a0/cpu:0", home=True),
                    pb.ScalingHolderInfo(name="a1/cpu:0"),
                ],
            ),
            pb.ScalingRunInfo(replica_id="other", layer_start=0, layer_end=8),
        ]
    )
    d = sd.ScalingDriver(
        channels=agents.Channels(None),
        origin=sd.Peer("a0", "a0:1"),
        replica_id="r0",
        num_layers=4,
        hidden=256,
        peers=[sd.Peer("a1", "a1:1")],
        cfg=ms.ScalingConfig(enabled=True),
        replica_bytes=1 << 20,
    )
    assert d.adopt(reply) == 2
    assert d.state.replicas == (("a1/cpu:0",), ("a1/cpu:0",), (), ())


def test_a_replication_in_flight_is_adopted_and_its_target_is_not_idle() -> None:
    """An operator killed mid-replication: the origin reports it in `scaling_pending`; a
    new driver takes its layers as placed and the target as busy, so it repeats nothing."""
    d, origin, _ = _driver()
    origin.describe.scaling_pending.add(
        replica_id="r0", layer_start=0, layer_end=8, target_address="a1:1", target_device=""
    )
    origin.describe.scaling_pending.add(replica_id="other", layer_end=8, target_address="a1:1")
    assert d.adopt(origin.describe) == 8 and d.replicated
    assert d.observe()["a1/cpu:0"].idle_fraction == 0.0
    assert d.tick_up(batch=4).actions == () and origin.calls == []
    del origin.describe.scaling_pending[:]  # it failed: nothing placed, the peer idle again
    assert d.adopt(origin.describe) == 0 and not d.replicated
    assert d.observe()["a1/cpu:0"].idle_fraction == 1.0
