"""The operator refuses what its configuration does not allow (issue 31), end to end on the
test API server: a model path outside the allowed roots, a LoadBalancer Service, a hostPath
checkpoint. Each ServingDeployment gets Ready=False and Stalled=True with the refusal's
reason and a message naming the field, phase Invalid, and no gateway objects; agents are
never called (the static agent's address accepts no connection)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from tessera.control import agents
from tessera.policies.security import admission
from tests.operator.conftest import (
    GROUP,
    VERSION,
    condition,
    create,
    get_sd,
    wait_for,
)

pytestmark = pytest.mark.slow


def _sd(name: str, model: dict[str, Any], service_type: str = "ClusterIP") -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ServingDeployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "model": {"name": "m", **model},
            "gateway": {"port": 8000, "serviceType": service_type},
        },
    }


def test_refused_specs_stall_with_the_reason(start_operator: Any, kube: client.ApiClient) -> None:
    op = start_operator(
        [agents.AgentRef("agent-0", "127.0.0.1:9")], admission=admission.Limits(("/models",))
    )
    cases = {
        "outside": (_sd("outside", {"path": "/etc"}), admission.MODEL_PATH_NOT_ALLOWED),
        "host": (_sd("host", {"path": "/models/llama"}), admission.HOST_PATH_NOT_ALLOWED),
        "lb": (
            _sd("lb", {"pvc": "cache", "subPath": "llama"}, "LoadBalancer"),
            admission.SERVICE_TYPE_NOT_ALLOWED,
        ),
    }
    for body, _ in cases.values():
        create(kube, body)
    for name, (_, reason) in cases.items():
        obj = wait_for(
            f"{name}: Ready=False {reason}",
            lambda n=name, r=reason: (
                (o := get_sd(kube, n)) and condition(o, "Ready").get("reason") == r and o
            ),
        )
        assert condition(obj, "Stalled")["status"] == "True"
        assert obj["status"]["phase"] == "Invalid"
        assert condition(obj, "Ready")["message"].startswith("spec.")
    message = condition(get_sd(kube, "outside"), "Ready")["message"]
    assert "'/etc' is outside the allowed model roots (/models)" in message
    names = [
        d.metadata.name for d in client.AppsV1Api(kube).list_namespaced_deployment("default").items
    ]
    assert names == []  # no gateway for a refused spec
    assert op.alive
