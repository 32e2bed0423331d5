"""The operator with an overload drop (issue 13), end to end on KMock and two local agents.

`spec.policies.overload.enabled`; two whole replicas. The test drives a drop the way the
overload loop does (`drop_plan.plan_drop` -> `overload_steps.drop_steps` over the
agents' `OverloadShift` RPC, no routes callback: the operator's reconcile routes the
group itself), then a restore. Checks: `status.overload.groups`, the `Overloaded`
condition (True `LayersDropped`, then False `WholeReplicas`), the `OverloadDropped` /
`OverloadRestored` events, and that several resync passes while the drop is active
neither unload nor load a block (the dropped layout is desired, not drift: the agents
still hold the pipeline) while Ready stays True and the routes name the head only.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera import routes_doc
from tessera.cli import local_agents
from tessera.control import overload_driver
from tessera.policies.overload import drop_plan
from tessera.policies.overload import steps as overload_steps
from tessera_operator import gateway_objects
from tests.operator.conftest import (
    GROUP,
    PLURAL,
    VERSION,
    condition,
    custom,
    events,
    get_sd,
    wait_for,
)
from tests.operator.test_operator_lifecycle import blocks, manifest, ready, refs

pytestmark = pytest.mark.slow
Start = Callable[..., list[local_agents.AgentProcess]]
WHOLE = [
    {"name": f"r{i}", "stages": [{"agent": f"agent-{i}", "device": "cpu:0", "layers": [0, 8]}]}
    for i in range(2)
]
R0, R1 = "default.ovl.r0.g1", "default.ovl.r1.g1"


def _drive(steps: list[overload_steps.Step]) -> None:
    async def go() -> None:
        driver = overload_driver.Driver(chunk_pages=4, tls=None)
        try:
            await driver.run(steps)
        finally:
            await driver.close()

    asyncio.run(go())


def _routes(kube: client.ApiClient) -> list[str]:
    cm = client.CoreV1Api(kube).read_namespaced_config_map("ovl-gateway-routes", "default")
    doc = routes_doc.parse(json.loads(cm.data[gateway_objects.ROUTES_KEY]))
    return list(doc.replica_ids)


def _overloaded(kube: client.ApiClient, status: str) -> dict[str, Any] | None:
    obj = get_sd(kube, "ovl")
    return obj if condition(obj, "Overloaded").get("status") == status else None


def test_drop_is_reported_kept_by_reconcile_then_restored(
    agents_factory: Start,
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
) -> None:
    procs = agents_factory(2)
    start_operator(refs(procs), resync_seconds=0.5)
    doc = manifest("ovl", tiny_llama, WHOLE)
    doc["spec"]["policies"] = {"overload": {"enabled": True}}
    custom(kube).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, doc)
    wait_for("Ready=True", lambda: ready(kube, "ovl"))

    members = {
        R0: overload_steps.Member(R0, procs[0].address),
        R1: overload_steps.Member(R1, procs[1].address),
    }
    whole = frozenset(range(8))
    plan = drop_plan.plan_drop(
        drop_plan.DropInput(
            (drop_plan.Replica(R0, whole), drop_plan.Replica(R1, whole)), (1 << 20,) * 8, 1
        )
    )
    (group,) = plan.groups
    _drive(list(overload_steps.drop_steps(group, members)))
    dropped = blocks(procs[0]) + blocks(procs[1])
    assert dropped == [(R0, 0, 0, 4), (R0, 1, 4, 8)]

    try:
        obj = wait_for("Overloaded=True", lambda: _overloaded(kube, "True"), timeout=30)
    except AssertionError:  # say what the operator did instead
        sd = get_sd(kube, "ovl") or {}
        raise AssertionError(f"{sd.get('status')}; events {events(kube, 'ovl')}") from None
    c = condition(obj, "Overloaded")
    assert c["reason"] == "LayersDropped" and "agent-1 [4, 8)" in c["message"]
    (g,) = obj["status"]["overload"]["groups"]
    assert g["head"] == R0 and [s["layers"] for s in g["stages"]] == [[0, 4], [4, 8]]
    wait_for("OverloadDropped event", lambda: "OverloadDropped" in dict(events(kube, "ovl")))
    wait_for("routes name the head only", lambda: _routes(kube) == [R0])

    # several resync passes later: nothing unloaded or reloaded, still Ready
    seen = len(events(kube, "ovl"))
    time.sleep(3.0)
    assert blocks(procs[0]) + blocks(procs[1]) == dropped
    later = [r for r, _ in events(kube, "ovl")[seen:]]
    assert not {"BlockLoaded", "BlockUnloaded", "StageRewired"} & set(later), later
    assert condition(get_sd(kube, "ovl"), "Ready").get("status") == "True"

    _drive(list(overload_steps.restore_steps(group, members, 8)))
    assert blocks(procs[0]) + blocks(procs[1]) == [(R0, 0, 0, 8), (R1, 0, 0, 8)]
    obj = wait_for("Overloaded=False", lambda: _overloaded(kube, "False"))
    assert condition(obj, "Overloaded")["reason"] == "WholeReplicas"
    assert "groups" not in (obj["status"].get("overload") or {})
    wait_for("OverloadRestored event", lambda: "OverloadRestored" in dict(events(kube, "ovl")))
    wait_for("routes name both again", lambda: sorted(_routes(kube)) == [R0, R1])
    wait_for("Ready=True", lambda: ready(kube, "ovl"))
