"""Which agents a ServingDeployment may use: the static list, or the agent pods in the cluster.

Called by `reconciler.py` at every pass (level-triggered: pods come and go). In a cluster
the agents are the pods matching `config.agent_selector` (the agent DaemonSet), named
after their node (`spec.nodeName`, which explicit layouts refer to) and reached at
`<podIP>:<agent_port>`; `spec.resources.nodeSelector` keeps only agents on nodes with
those labels. In tests and local runs the static list (`--agent name=host:port`) is used
as given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tessera.control import agents
from tessera_operator import config, kube


def from_pods(
    pods: Iterable[Mapping[str, Any]], port: int, nodes: set[str] | None = None
) -> list[agents.AgentRef]:
    """Agents of running pods with an IP (on `nodes` when given), sorted by name."""
    refs: dict[str, agents.AgentRef] = {}
    for pod in pods:
        spec, st = pod.get("spec") or {}, pod.get("status") or {}
        if st.get("phase") != "Running" or not st.get("podIP"):
            continue
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        node = spec.get("nodeName") or ""
        if nodes is not None and node not in nodes:
            continue
        name = node or pod["metadata"]["name"]
        refs.setdefault(name, agents.AgentRef(name, f"{st['podIP']}:{port}"))
    return [refs[n] for n in sorted(refs)]


async def agent_refs(
    cfg: config.OperatorConfig, client: kube.Kube, node_selector: Mapping[str, str]
) -> list[agents.AgentRef]:
    if cfg.agents:
        return list(cfg.agents)
    pods = await client.list(
        kube.path("v1", "pods", cfg.agent_namespace or None), label_selector=cfg.agent_selector
    )
    nodes = None
    if node_selector:
        found = await client.list(
            kube.path("v1", "nodes"),
            label_selector=",".join(f"{k}={v}" for k, v in sorted(node_selector.items())),
        )
        nodes = {n["metadata"]["name"] for n in found}
    return from_pods(pods, cfg.agent_port, nodes)
