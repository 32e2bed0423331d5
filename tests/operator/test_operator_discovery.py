"""Agent discovery in a cluster: agent pods found by label, named after their node, filtered
by the deployment's nodeSelector (the nodes' labels), and reached at podIP:agentPort."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.cli import local_agents
from tessera_operator import discovery
from tests.operator.conftest import create, wait_for
from tests.operator.test_operator_lifecycle import blocks, manifest, ready

MERGE = "application/merge-patch+json"


def _pod(name: str, node: str, component: str = "agent") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/component": component}},
        "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "tessera"}]},
    }


def test_from_pods_keeps_running_pods_with_an_ip_on_selected_nodes() -> None:
    def pod(name: str, node: str, phase: str = "Running", ip: str = "10.0.0.1") -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "spec": {"nodeName": node},
            "status": {"phase": phase, "podIP": ip},
        }

    pods = [
        pod("a", "node-b", ip="10.0.0.2"),
        pod("b", "node-a"),
        pod("c", "node-c", phase="Pending"),
        pod("d", "node-d", ip=""),
    ]
    refs = discovery.from_pods(pods, 50051)
    assert [(r.name, r.address) for r in refs] == [
        ("node-a", "10.0.0.1:50051"),
        ("node-b", "10.0.0.2:50051"),
    ]
    assert [r.name for r in discovery.from_pods(pods, 50051, nodes={"node-b"})] == ["node-b"]


@pytest.mark.slow
def test_operator_discovers_agent_pods_by_label_and_node_selector(
    agents_factory: Callable[..., list[local_agents.AgentProcess]],
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
) -> None:
    (agent,) = agents_factory(1)
    host, port = agent.address.rsplit(":", 1)
    core = client.CoreV1Api(kube)
    for node, gpu in (("node-a", "yes"), ("node-b", "no")):
        core.create_node(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"gpu": gpu}}}
        )
    for name, node, ip in (("agent-a", "node-a", host), ("agent-b", "node-b", "192.0.2.1")):
        core.create_namespaced_pod("tessera-system", _pod(name, node))
        core.patch_namespaced_pod_status(
            name,
            "tessera-system",
            {"status": {"phase": "Running", "podIP": ip}},
            _content_type=MERGE,
        )
    core.create_namespaced_pod("tessera-system", _pod("gateway-x", "node-a", "gateway"))
    start_operator(
        [],
        agent_selector="app.kubernetes.io/component=agent",
        agent_namespace="tessera-system",
        agent_port=int(port),
    )
    doc = manifest(
        "found",
        tiny_llama,
        [{"name": "r0", "stages": [{"agent": "node-a", "device": "cpu:0", "layers": [0, 8]}]}],
    )
    doc["spec"]["resources"] = {"nodeSelector": {"gpu": "yes"}}
    create(kube, doc)
    obj = wait_for("Ready=True", lambda: ready(kube, "found"))
    assert obj["status"]["plan"]["replicas"][0]["stages"][0]["agent"] == "node-a"
    assert blocks(agent) == [("default.found.r0.g1", 0, 0, 8)]
