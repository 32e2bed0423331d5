"""Live transitions through the operator: KMock API server, real agent processes.

`kubectl apply` of a changed explicit layout (a merge patch of the spec) runs a
transition: two whole replicas → one whole + a two-stage pipeline → the pipeline split at
other layers → back. Mid-transition (routes cut over, the leaving replica not yet freed)
the operator is stopped and a new one started: it resumes from what it observes. A
transition that cannot be done (one replica, no memory for the new layout beside it)
ends Stalled with the reason while the old layout keeps serving. At each quiescent point
the status kstatus computes (`tests/operator/kstatus.py`) matches what the agents hold
and the routes ConfigMap says.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.cli import local_agents
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tests.conftest import hf_greedy
from tests.operator import kstatus
from tests.operator.conftest import (
    GROUP,
    PLURAL,
    VERSION,
    condition,
    create,
    custom,
    events,
    get_sd,
    wait_for,
)
from tests.operator.test_operator_lifecycle import blocks, manifest, ready, refs

pytestmark = pytest.mark.slow
PROMPT = [1, 5, 9, 13]
Start = Callable[..., list[local_agents.AgentProcess]]


def _whole(name: str, agent: str) -> dict[str, Any]:
    return {"name": name, "stages": [{"agent": agent, "device": "cpu:0", "layers": [0, 8]}]}


def _pipe(name: str, split: int) -> dict[str, Any]:
    return {
        "name": name,
        "stages": [
            {"agent": "agent-0", "device": "cpu:0", "layers": [0, split]},
            {"agent": "agent-1", "device": "cpu:0", "layers": [split, 8]},
        ],
    }


def _apply(kube: client.ApiClient, name: str, replicas: list[dict[str, Any]]) -> None:
    """What `kubectl apply` of the changed manifest sends for the layout."""
    custom(kube).patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, name, {"spec": {"layout": {"replicas": replicas}}}
    )


def _routes(kube: client.ApiClient, name: str) -> dict[str, Any]:
    cm = client.CoreV1Api(kube).read_namespaced_config_map(f"{name}-gateway-routes", "default")
    doc: dict[str, Any] = json.loads(cm.data["routes.json"])
    return doc


def _tokens(agent: local_agents.AgentProcess, replica: str) -> list[int]:
    stub = pb_grpc.AgentStub(transport.sync_channel(agent.address, tls=None))
    return local_agents.generate_tokens(stub, replica, PROMPT, 6)


def _real(
    kube: client.ApiClient, name: str, procs: list[local_agents.AgentProcess]
) -> tuple[dict[str, list[tuple[str, int, int, int]]], list[str], int]:
    held = {p.agent_id: blocks(p) for p in procs}
    doc = _routes(kube, name)
    return held, [r["id"] for r in doc["replicas"]], doc["version"]


def test_transitions_resume_after_an_operator_restart(
    agents_factory: Start,
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
) -> None:
    procs = agents_factory(2)
    a0, a1 = procs
    # a long settle time holds the first operator's transition after its cut-over (the
    # leaving replica idle but not yet freed) long enough to stop the operator there
    first = start_operator(refs(procs), drain_settle_seconds=60.0)
    custom(kube).create_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        manifest("live", tiny_llama, [_whole("r0", "agent-0"), _whole("r1", "agent-1")]),
    )
    obj = wait_for("generation 1 Current", lambda: ready(kube, "live"), timeout=180)
    assert kstatus.compute(obj) == "Current"
    assert _real(kube, "live", procs) == (
        {
            "agent-0": [("default.live.r0.g1", 0, 0, 8)],
            "agent-1": [("default.live.r1.g1", 0, 0, 8)],
        },
        ["default.live.r0.g1", "default.live.r1.g1"],
        1,
    )
    expected = _tokens(a0, "default.live.r0.g1")
    assert expected == hf_greedy(tiny_llama, PROMPT, 6)  # every layout below must match

    # 1 whole + a two-stage pipeline; caught after the cut-over, before the old r1 is freed
    _apply(kube, "live", [_whole("r0", "agent-0"), _pipe("r1", 4)])

    def draining() -> dict[str, Any] | None:
        o = get_sd(kube, "live")
        t = (o or {}).get("status", {}).get("transition") or {}
        return o if o and t.get("action") == "Drain" and t.get("generation") == 2 else None

    obj = wait_for("the transition to wait on the drain", draining, timeout=180, every=0.05)
    first.stop()
    held, routed, version = _real(kube, "live", procs)
    assert (routed, version) == (["default.live.r0.g1", "default.live.r1.g2"], 2)
    assert ("default.live.r1.g1", 0, 0, 8) in held["agent-1"]  # not freed yet
    assert ("default.live.r1.g2", 1, 4, 8) in held["agent-1"]  # loaded beside it
    assert kstatus.compute(obj) == "InProgress"
    assert condition(obj, "Ready")["status"] == "True"  # a complete generation serves
    progressing = condition(obj, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "Switching")
    assert "drain default.live.r1.g1" in progressing["message"]

    start_operator(refs(procs))  # a new operator (default settle): nothing in memory
    obj = wait_for("generation 2 Current", lambda: ready(kube, "live", 2), timeout=180)
    assert kstatus.compute(obj) == "Current" and obj["status"]["plan"]["generation"] == 2
    assert _real(kube, "live", procs) == (
        {
            "agent-0": [("default.live.r0.g1", 0, 0, 8), ("default.live.r1.g2", 0, 0, 4)],
            "agent-1": [("default.live.r1.g2", 1, 4, 8)],
        },
        ["default.live.r0.g1", "default.live.r1.g2"],
        2,
    )
    assert _tokens(a0, "default.live.r1.g2") == expected

    # the pipeline split at other layers, then back to two whole replicas
    for gen, layout, want in (
        (
            3,
            [_whole("r0", "agent-0"), _pipe("r1", 6)],
            {
                "agent-0": [("default.live.r0.g1", 0, 0, 8), ("default.live.r1.g3", 0, 0, 6)],
                "agent-1": [("default.live.r1.g3", 1, 6, 8)],
            },
        ),
        (
            4,
            [_whole("r0", "agent-0"), _whole("r1", "agent-1")],
            {
                "agent-0": [("default.live.r0.g1", 0, 0, 8)],
                "agent-1": [("default.live.r1.g4", 0, 0, 8)],
            },
        ),
    ):
        _apply(kube, "live", layout)
        obj = wait_for(f"generation {gen} Current", lambda g=gen: ready(kube, "live", g), 180)
        assert kstatus.compute(obj) == "Current"
        held, routed, version = _real(kube, "live", procs)
        assert held == want and version == gen
        leader = a0 if gen == 3 else a1
        assert _tokens(leader, f"default.live.r1.g{gen}") == expected
    reasons = [r for r, _ in events(kube, "live")]
    assert reasons.count("RoutesCutOver") == 4 and reasons.count("Switching") >= 3
    assert "Switched" in reasons


def test_impossible_transition_keeps_the_old_layout_serving(
    agents_factory: Start,
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
) -> None:
    # 40 MiB devices: one whole replica (23.5 MiB of parameters, 16 MiB of KV) fits, but
    # not a new [0, 6) stage's 17.4 MiB of parameters beside it even with the old KV pool
    # shrunk (issue 34), and no other replica could serve meanwhile
    procs = agents_factory(2, devices="cpu:1x40MiB")
    start_operator(refs(procs))
    create(kube, manifest("tight", tiny_llama, [_whole("r0", "agent-0")]))
    wait_for("generation 1 Current", lambda: ready(kube, "tight"), timeout=180)
    expected = _tokens(procs[0], "default.tight.r0.g1")
    assert expected == hf_greedy(tiny_llama, PROMPT, 6)
    _apply(kube, "tight", [_pipe("r0", 6)])

    def stalled() -> dict[str, Any] | None:
        o = get_sd(kube, "tight")
        ok = o and o["status"].get("observedGeneration") == 2
        return o if ok and condition(o, "Stalled").get("status") == "True" else None

    obj = wait_for("Stalled", stalled, timeout=180)
    st = condition(obj, "Stalled")
    assert st["reason"] == "InsufficientMemory"
    assert "agent-0/cpu:0" in st["message"] and "default.tight.r0.g2" in st["message"]
    assert kstatus.compute(obj) == "Failed"
    assert condition(obj, "Ready")["status"] == "True"  # the old layout keeps serving
    assert condition(obj, "Reconciling")["status"] == "False"
    held, routed, version = _real(kube, "tight", procs)
    assert held == {"agent-0": [("default.tight.r0.g1", 0, 0, 8)], "agent-1": []}
    assert (routed, version) == (["default.tight.r0.g1"], 1)
    assert _tokens(procs[0], "default.tight.r0.g1") == expected
    # applying the old layout again is Current at once: nothing to do
    _apply(kube, "tight", [_whole("r0", "agent-0")])
    obj = wait_for("generation 3 Current", lambda: ready(kube, "tight", 3), timeout=120)
    assert kstatus.compute(obj) == "Current"
