"""Module scaling in status and events: layer runs from Describe to `status.scaling`."""

from __future__ import annotations

import kopf
import pytest

from tessera import observed
from tessera.control import agents
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_operator import announced, scaling


def _describe(home: str, replicas: list[str], migrated: bool) -> pb.DescribeReply:
    holders = [pb.ScalingHolderInfo(name=home, home=True, requests=2)]
    holders += [pb.ScalingHolderInfo(name=h, requests=1) for h in replicas]
    run = pb.ScalingRunInfo(
        replica_id="ns.m.r0.g0",
        stage_index=0,
        layer_start=2,
        layer_end=6,
        origin="migrated" if migrated else home,
        holders=holders,
    )
    return pb.DescribeReply(agent_id="a0", scaling_runs=[run])


def _doc(d: pb.DescribeReply) -> list[dict[str, object]]:
    info = observed.AgentInfo("a0", "x:1", layer_runs=agents.runs_from_describe(d))
    return scaling.status_doc(observed.Observed((info,)), {"ns.m.r0.g0"})


def test_status_lists_runs_and_events_name_each_change() -> None:
    one = _doc(_describe("a0/cpu:0", ["a1/cpu:0"], False))
    assert one == [
        {
            "replica": "ns.m.r0.g0",
            "stage": 0,
            "layers": [2, 6],
            "agent": "a0",
            "migrated": False,
            "home": "a0/cpu:0",
            "replicas": ["a1/cpu:0"],
        }
    ]
    assert scaling.status_doc(observed.Observed(()), {"x"}) == []
    assert scaling.changes([], one) == [
        ("LayerRunReplicated", "ns.m.r0.g0 stage 0 layers [2, 6) replicated onto a1/cpu:0")
    ]
    moved = _doc(_describe("a1/cpu:0", [], True))
    assert moved[0]["migrated"] is True
    reasons = [r for r, _ in scaling.changes(one, moved)]
    assert reasons == ["LayerRunEvicted", "LayerRunMigrated"]
    other = scaling.status_doc(
        observed.Observed(
            (
                observed.AgentInfo(
                    "a0", "x", layer_runs=agents.runs_from_describe(_describe("h", [], False))
                ),
            )
        ),
        {"another"},
    )
    assert other == []  # another deployment's runs are not ours


def test_a_replication_is_announced_once_over_a_stale_body(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two passes over one body whose status predates the first pass's write (a timer's
    cached body): `LayerRunReplicated` is posted once; a body that caught up posts
    nothing, and the eviction is posted once too."""
    posted: list[str] = []
    monkeypatch.setattr(announced.kopf, "info", lambda body, reason, message: posted.append(reason))

    def body(version: str) -> kopf.Body:
        return kopf.Body({"metadata": {"uid": "u1", "resourceVersion": version}})

    runs = {"layerRuns": _doc(_describe("a0/cpu:0", ["a1/cpu:0"], False))}
    seen = scaling.posted()
    seen.record(body("1"), {}, runs)
    seen.record(body("1"), {}, runs)  # the same stale body again
    seen.record(body("2"), runs, runs)  # caught up
    assert posted == ["LayerRunReplicated"]
    seen.record(body("2"), runs, {})
    seen.record(body("2"), runs, {})
    assert posted == ["LayerRunReplicated", "LayerRunEvicted"]
