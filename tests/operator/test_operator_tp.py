"""The operator runs a tensor-parallel replica: a tp=2 stage over two agents, reconciled
against the KMock API server, serves transformers' tokens; its status shows tp."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.cli import local_agents
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tests.conftest import hf_greedy
from tests.operator.conftest import GROUP, PLURAL, VERSION, create, custom
from tests.operator.test_operator_lifecycle import _complete, manifest, ready, refs, wait_for

pytestmark = pytest.mark.slow
Start = Callable[..., list[local_agents.AgentProcess]]

TP2 = [
    {
        "name": "r0",
        "stages": [
            {
                "agent": "agent-0",
                "device": "cpu:0",
                "layers": [0, 8],
                "tp": 2,
                "ranks": [{"agent": "agent-1", "device": "cpu:0"}],
            }
        ],
    }
]


def _blocks(agent: local_agents.AgentProcess) -> list[pb.BlockInfo]:
    stub = pb_grpc.AgentStub(transport.sync_channel(agent.address, tls=None))
    return list(stub.ListBlocks(pb.ListBlocksRequest(), timeout=5).blocks)


def test_operator_serves_a_tp2_replica(
    agents_factory: Start,
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
    tmp_path: Path,
) -> None:
    procs = agents_factory(2)
    start_operator(refs(procs))
    create(kube, manifest("tp", tiny_llama, TP2))
    obj = wait_for("Ready=True", lambda: ready(kube, "tp"), timeout=180)
    (rep,) = obj["status"]["plan"]["replicas"]
    assert rep["stages"][0]["tp"] == 2
    (lead,) = _blocks(procs[0])
    (follower,) = _blocks(procs[1])
    assert (lead.tp_rank, lead.tp_size, follower.tp_rank, follower.tp_size) == (0, 2, 1, 2)
    rid = lead.replica_id
    assert follower.replica_id == rid
    stub = pb_grpc.AgentStub(transport.sync_channel(procs[0].address, tls=None))
    wait_for(
        "the group to form",
        lambda: all(b.group_state == "ready" for p in procs for b in _blocks(p)),
        timeout=60,
    )
    assert {b.transport for p in procs for b in _blocks(p)} == {"gloo"}
    prompt = [0, 44, 45, 46]
    assert local_agents.generate_tokens(stub, rid, prompt, 8) == hf_greedy(tiny_llama, prompt, 8)
    cm = client.CoreV1Api(kube).read_namespaced_config_map("tp-gateway-routes", "default")
    routes = json.loads(cm.data["routes.json"])
    assert [r["id"] for r in routes["replicas"]] == [rid]
    answer = asyncio.run(_complete(routes, tmp_path))
    assert answer["usage"]["completion_tokens"] == 4, answer
    custom(kube).delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "tp")
    wait_for("blocks unloaded", lambda: not _blocks(procs[0]) and not _blocks(procs[1]), 90)


def test_operator_places_both_ranks_on_one_agents_devices(
    agents_factory: Start,
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
) -> None:
    """A tp=2 stage naming no `ranks` goes on its agent's devices cpu:0 and cpu:1 (a node
    agent serving TP alone): both blocks load there, serve transformers' tokens, and the
    deletion unloads each rank by its number."""
    (agent,) = agents_factory(1, devices="cpu:2x512MiB")
    start_operator(refs([agent]))
    layout = [{"name": "r0", "stages": [{"agent": "agent-0", "layers": [0, 8], "tp": 2}]}]
    create(kube, manifest("node", tiny_llama, layout))
    wait_for("Ready=True", lambda: ready(kube, "node"), timeout=180)
    wait_for(
        "the group to form",
        lambda: [b.group_state for b in _blocks(agent)] == ["ready", "ready"],
        timeout=60,
    )
    held = _blocks(agent)
    assert [(b.tp_rank, b.device) for b in held] == [(0, "cpu:0"), (1, "cpu:1")]
    stub = pb_grpc.AgentStub(transport.sync_channel(agent.address, tls=None))
    prompt = [0, 44, 45, 46]
    assert local_agents.generate_tokens(stub, held[0].replica_id, prompt, 8) == hf_greedy(
        tiny_llama, prompt, 8
    )
    custom(kube).delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "node")
    wait_for("blocks unloaded", lambda: not _blocks(agent), 90)
