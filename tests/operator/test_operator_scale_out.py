"""A scale-out through the operator (issue 32): the new replica is assembled from a peer.

KMock API server, two real agent processes, the tiny checkpoint; the agents read storage
at a declared 50 MB/s (a network volume: the page cache would beat any peer link, and the
measured links would then rightly choose storage). One replica serves on agent-0 (read
from storage); a spec change adds a second on agent-1: its load copies every byte from
agent-0's block (the switch plan's parts), none from storage;
`status.replicaSources` says so for both replicas, a `ReplicaReady` event is recorded per
new replica, and the new replica answers with the first one's tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.cli import local_agents
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tests.operator.conftest import GROUP, PLURAL, VERSION, create, custom, events, wait_for
from tests.operator.test_operator_lifecycle import manifest, ready, refs

pytestmark = pytest.mark.slow


def _replica(name: str, agent: str) -> dict[str, Any]:
    return {"name": name, "stages": [{"agent": agent, "device": "cpu:0", "layers": [0, 8]}]}


def _greedy(agent: local_agents.AgentProcess, replica_id: str) -> list[int]:
    stub = pb_grpc.AgentStub(transport.sync_channel(agent.address, tls=None))
    req = pb.GenerateRequest(
        replica_id=replica_id,
        request_id=f"t-{replica_id}",
        prompt_token_ids=[3, 1, 4, 1],
        params=pb.SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True),
    )
    return [t for chunk in stub.Generate(req, timeout=30) for t in chunk.token_ids]


@pytest.fixture
def slow_storage_agents() -> Iterator[list[local_agents.AgentProcess]]:
    slow = ("--storage-bandwidth", "50e6")
    procs = [
        local_agents.start_agent(f"agent-{i}", "cpu:1x512MiB", 1, extra_args=slow) for i in range(2)
    ]
    yield procs
    for p in procs:
        local_agents.stop_agent(p)


def test_scale_out_sources_the_new_replica_from_a_peer(
    slow_storage_agents: list[local_agents.AgentProcess],
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
) -> None:
    procs = slow_storage_agents
    start_operator(refs(procs))
    create(kube, manifest("grow", tiny_llama, [_replica("r0", "agent-0")]))
    obj = wait_for("Ready=True", lambda: ready(kube, "grow"))
    (first,) = obj["status"]["replicaSources"]
    assert first["replicaId"] == "default.grow.r0.g1"
    assert first["source"]["storage"] > 0 and first["source"]["peer"] == 0
    assert first["readySeconds"] > 0

    custom(kube).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        "grow",
        {"spec": {"layout": {"replicas": [_replica("r0", "agent-0"), _replica("r1", "agent-1")]}}},
    )

    def scaled() -> dict[str, Any] | None:
        got = ready(kube, "grow", generation=2)
        return got if got and len(got["status"].get("replicaSources", [])) == 2 else None

    obj = wait_for("two replicas ready", scaled)
    by_id = {d["replicaId"]: d for d in obj["status"]["replicaSources"]}
    new = next(d for rid, d in by_id.items() if ".r1." in rid)
    # every byte from agent-0 over the data plane (docs/scaling.md: a data-plane part keeps
    # the plan's choice; the probe's gRPC rate is only a floor for it)
    src = new["source"]
    assert src["host"] == 0 and src["storage"] == 0
    assert src["peer"] == first["source"]["storage"]
    reasons = wait_for(
        "ReplicaReady events",
        lambda: [m for r, m in events(kube, "grow") if r == "ReplicaReady"][1:],
    )
    assert new["replicaId"] in reasons[0] and "from peers" in reasons[0]
    loaded = [m for r, m in events(kube, "grow") if r == "BlockLoaded"]
    assert any("r1" in m and "copy from agent-0" in m for m in loaded), loaded
    r0_id = next(rid for rid in by_id if ".r0." in rid)
    assert _greedy(procs[1], new["replicaId"]) == _greedy(procs[0], r0_id)
