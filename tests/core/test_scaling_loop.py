"""The periodic module-scaling loop (`tessera.control.scaling_loop`) drives the scaling driver.

Fake agents (those of `test_scaling_driver`) record the operations. The gateway's
inter-token histogram is fed by hand: a window over the TPOT target with no idle peer
cuts the leader's batch; a quiet window lifts the cut; once the peer is idle a violating
window replicates onto it (a calm one does not); a sustained calm evicts the replica once
and nothing is replicated again while it lasts; a replica that is gone loses its driver.
`run` fires ticks periodically until stopped. `for_up` is None when the spec's policy is
off and reads the model's hidden size otherwise.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from tessera import api
from tessera.control import scaling_loop
from tessera.policies.scaling import module_scaling as ms
from tessera.policies.scaling import signal as sig
from tessera.rpc.v1 import agent_pb2 as pb
from tests.core.test_scaling_driver import FakeAgent, _dev

BOUNDS = (0.01, 0.05, 0.1, math.inf)


def _slow(k: int) -> sig.Hist:
    """The cumulative histogram after k windows of 100 gaps, 80 of each over 50 ms."""
    return sig.Hist(BOUNDS, (0, 10 * k, 20 * k, 100 * k), 100 * k, 8.0 * k)


def _rising() -> list[sig.Hist]:
    return [_slow(k) for k in range(1, 1000)]


def _agents(peer_busy: bool) -> tuple[FakeAgent, FakeAgent]:
    origin = FakeAgent(
        pb.DescribeReply(
            devices=[_dev(0)],
            blocks=[
                pb.BlockInfo(
                    replica_id="r0",
                    num_stages=1,
                    layer_end=8,
                    param_bytes=16 << 20,
                    kv_bytes=16 << 20,
                )
            ],
            kv=[pb.ReplicaKV(replica_id="r0", running=20, max_num_seqs=256)],
        )
    )
    peer = FakeAgent(
        pb.DescribeReply(
            devices=[_dev(64 << 20)],
            kv=[pb.ReplicaKV(replica_id="x", running=1 if peer_busy else 0)],
        )
    )
    return origin, peer


def _reporting(origin: FakeAgent, peer: FakeAgent) -> None:
    """Make the fake agents report what the loop applied, as real ones do: a replicated
    run on the origin (held by the peer), gone again once evicted."""
    replicate, evict = origin.ScalingReplicate, origin.ScalingEvict

    def rep(req: pb.ScalingOpRequest, timeout: float = 0) -> pb.ScalingOpReply:
        origin.describe.scaling_runs.add(
            replica_id=req.replica_id,
            layer_start=req.layer_start,
            layer_end=req.layer_end,
            holders=[
                pb.ScalingHolderInfo(name="a0/cpu:0", home=True),
                pb.ScalingHolderInfo(name="a1/cpu:0"),
            ],
        )
        peer.describe.scaling_hosted.add(layer_start=req.layer_start, layer_end=req.layer_end)
        return replicate(req, timeout)

    def ev(req: pb.ScalingOpRequest, timeout: float = 0) -> pb.ScalingOpReply:
        del origin.describe.scaling_runs[:]
        del peer.describe.scaling_hosted[:]
        return evict(req, timeout)

    origin.ScalingReplicate = rep  # type: ignore[method-assign]
    origin.ScalingEvict = ev  # type: ignore[method-assign]


def _loop(
    origin: FakeAgent,
    peer: FakeAgent,
    hists: list[sig.Hist],
    cfg: ms.ScalingConfig | None = None,
    clock: list[float] | None = None,
) -> scaling_loop.ScalingLoop:
    feed = iter(hists)
    now = clock if clock is not None else [0.0]
    loop = scaling_loop.ScalingLoop(
        cfg or ms.ScalingConfig(enabled=True),
        tpot_target_s=0.05,
        agents=[scaling_loop.AgentAt("a0", "a0:1"), scaling_loop.AgentAt("a1", "a1:1")],
        hidden=256,
        itl=lambda: next(feed),
        clock=lambda: now[0],
        tls=None,
    )
    stubs = {"a0:1": origin, "a1:1": peer}
    loop._stub = lambda address: stubs[address]  # type: ignore[method-assign, assignment, return-value]
    return loop


def test_tick_cuts_the_batch_under_violations_lifts_it_then_replicates() -> None:
    origin, peer = _agents(peer_busy=True)
    slow = _slow(1)  # 80 of 100 gaps over 50 ms
    loop = _loop(origin, peer, [slow, slow, slow, _slow(2), _slow(2)])
    lines = loop.tick()
    assert [k for k, _ in origin.calls] == ["batch"]
    assert 1 <= origin.calls[0][1].max_num_seqs < 20  # the running 20, cut
    assert any("batch cut 20 ->" in line for line in lines)
    assert loop.tick() == ["r0: batch cut lifted (violation rate 0.0%: lift the batch cut)"]
    assert origin.calls[-1] == ("batch", pb.ScalingBatchLimitRequest(replica_id="r0"))
    peer.describe.kv[0].running = 0  # the peer went idle: a calm window does not replicate
    assert loop.tick() == [] and len(origin.calls) == 2
    lines = loop.tick()  # a violating one does (Algorithm 1)
    assert [k for k, _ in origin.calls[2:]] == ["replicate"]
    assert origin.calls[2][1].target_address == "a1:1" and lines[0].startswith("r0: replicated")
    del origin.describe.blocks[:]  # a transition removed the replica: its driver goes
    loop.tick()
    assert loop.drivers == {}


def test_run_fires_the_driver_periodically_until_stopped() -> None:
    origin, peer = _agents(peer_busy=False)
    _reporting(origin, peer)
    loop = _loop(origin, peer, _rising())
    said: list[str] = []

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(scaling_loop.run(loop, stop, 0.01, said.append))
        for _ in range(500):
            if loop.ticks >= 3:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 5.0)

    asyncio.run(go())
    assert loop.ticks >= 3
    # the peer holds the run from then on; the violation goes on, so Algorithm 2 cuts
    kinds = [k for k, _ in origin.calls]
    assert kinds[0] == "replicate" and set(kinds[1:]) <= {"batch"}
    assert said and said[0].startswith("r0: replicated")


def test_a_sustained_calm_evicts_the_replicas_once_and_nothing_replicates_again() -> None:
    origin, peer = _agents(peer_busy=False)
    clock = [0.0]
    cfg = ms.ScalingConfig(enabled=True, evict_after_seconds=10.0)
    _reporting(origin, peer)
    loop = _loop(origin, peer, [_slow(1)] * 20, cfg=cfg, clock=clock)
    assert loop.tick()[0].startswith("r0: replicated")
    assert origin.describe.scaling_runs and peer.describe.scaling_hosted
    said: list[str] = []
    for _ in range(6):  # calm windows (no new gap) 3 s apart: evicted once 10 s are calm
        clock[0] += 3.0
        said += loop.tick()
        if any("evicted" in x for x in said):
            break
    assert [k for k, _ in origin.calls] == ["replicate", "evict"], said
    assert loop.calm_s >= 10.0 and "evictAfterSeconds 10" in said[0]
    assert not origin.describe.scaling_runs
    for _ in range(5):  # calm goes on: the idle peer is not replicated onto again
        clock[0] += 3.0
        assert loop.tick() == []
    assert [k for k, _ in origin.calls] == ["replicate", "evict"]


def test_for_up_reads_the_spec(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    off = SimpleNamespace(policies=SimpleNamespace(scaling=ms.ScalingConfig()))
    assert scaling_loop.for_up(off, str(tmp_path), [], None, tls=None) is None
    on = SimpleNamespace(
        policies=SimpleNamespace(scaling=ms.ScalingConfig(enabled=True)),
        slo=api.SLOSpec(tpot_p99_ms=80.0),
    )
    loop = scaling_loop.for_up(on, str(tmp_path), [("a0", "a0:1")], None, tls=None)
    assert loop is not None and loop.hidden == 64 and loop.target_s == 0.08


def test_up_policy_follows_manifest_edits_on_retune_off() -> None:
    """`tessera up`'s module-scaling policy (`cli/up_policies`) follows manifest edits:
    off → nothing runs; on → the loop starts; a changed policy reaches the loop and its
    drivers without a restart; off again → the loop stops and evicts what it added."""
    from tessera.cli import up_policies

    origin, peer = _agents(peer_busy=False)
    made: list[scaling_loop.ScalingLoop] = []
    said: list[str] = []

    def make(spec: object) -> scaling_loop.ScalingLoop:
        loop = _loop(origin, peer, _rising())
        loop.reconfigure(spec.policies.scaling, spec.slo.tpot_p99_ms / 1e3)  # type: ignore[attr-defined]
        made.append(loop)
        return loop

    def spec(cfg: ms.ScalingConfig, tpot_ms: float = 50.0) -> SimpleNamespace:
        return SimpleNamespace(
            policies=SimpleNamespace(scaling=cfg), slo=api.SLOSpec(tpot_p99_ms=tpot_ms)
        )

    async def go() -> None:
        stop = asyncio.Event()
        policy = up_policies.ScalingPolicy(
            make, lambda lp: scaling_loop.run(lp, stop, 0.01, said.append), said.append
        )
        await policy.sync(spec(ms.ScalingConfig()))
        assert policy.loop is None and not made
        await policy.sync(spec(ms.ScalingConfig(enabled=True)))
        assert policy.loop is made[0] and policy.task is not None
        for _ in range(500):  # the loop replicates onto the idle peer
            if any(k == "replicate" for k, _ in origin.calls):
                break
            await asyncio.sleep(0.01)
        assert [k for k, _ in origin.calls] == ["replicate"]
        tuned = ms.ScalingConfig(enabled=True, down_violation_rate=0.2)
        await policy.sync(spec(tuned, 80.0))
        assert len(made) == 1 and made[0].cfg == tuned and made[0].target_s == 0.08
        assert all(d.cfg == tuned for d in made[0].drivers.values()) and made[0].drivers
        origin.describe.scaling_runs.append(  # what the agent now reports
            pb.ScalingRunInfo(
                replica_id="r0",
                layer_end=4,
                holders=[
                    pb.ScalingHolderInfo(name="home", home=True),
                    pb.ScalingHolderInfo(name="a1/cpu:0", home=False),
                ],
            )
        )
        await policy.sync(spec(ms.ScalingConfig(), 80.0))
        assert policy.loop is None and policy.task is None
        assert origin.calls[-1][0] == "evict" and origin.calls[-1][1].holder == "a1/cpu:0"
        assert "module scaling: turned off by the manifest" in said
        stop.set()

    asyncio.run(go())


def test_each_applied_operation_is_reported_once_as_a_line_that_parses_back() -> None:
    origin, peer = _agents(peer_busy=False)
    loop = _loop(origin, peer, [_slow(1), _slow(1)])
    lines = loop.tick()
    ops = [o for o in map(scaling_loop.parse_op_line, lines) if o is not None]
    assert [o["op"] for o in ops] == [k for k, _ in origin.calls] == ["replicate"]
    assert ops[0]["start"] == 0 and ops[0]["end"] >= 1
    assert loop.tick() == []  # nothing new applied: nothing reported again
    reply = pb.ScalingOpReply(
        op="migrate", layer_start=2, layer_end=4, source="a0/cpu:0", target="a1/cpu:0",
        seconds=0.25, pause_s=0.0015, param_bytes=10, kv_bytes=20, kv_pages=3, requests=2,
    )  # fmt: skip
    got = scaling_loop.parse_op_line(scaling_loop.op_line("r0", reply))
    assert got is not None and (got["op"], got["start"], got["end"]) == ("migrate", 2, 4)
    assert (got["pause_ms"], got["kv_pages"], got["requests"]) == (1.5, 3, 2)
    assert scaling_loop.parse_op_line("r0: replicated 1 layers") is None


def test_the_scraped_and_the_collected_histogram_read_the_same() -> None:
    """The gateway's ITL histogram read from `/metrics` text and from the live object give one
    `Hist` (one conversion, `scaling_signal.from_samples`); a scrape without it says so."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from tessera.control import gateway_itl
    from tessera.control import scaling_loop as sl

    reg = CollectorRegistry()
    h = Histogram(gateway_itl.ITL, "itl", registry=reg, buckets=(0.01, 0.1, 1.0))
    for v in (0.005, 0.05, 0.5, 2.0):
        h.observe(v)
    scraped = gateway_itl.parse(generate_latest(reg).decode())
    assert scraped == sl.hist_of(h)
    assert scraped.counts == (1.0, 2.0, 3.0, 4.0) and scraped.total == 4.0
    with pytest.raises(ValueError, match="no tessera_gateway_inter_token_latency_seconds"):
        gateway_itl.parse("")
