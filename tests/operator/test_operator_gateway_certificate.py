"""The operator asks cert-manager for a gateway certificate bound to each ServingDeployment
(issue 31) when its gateway template names an issuer: a Certificate `<name>-gateway-tls`
with OU gateway and the URI SAN spiffe://tessera/ns/<ns>/sd/<name>, owned by the
ServingDeployment, and the gateway Deployment mounts the Secret it names. On the test API
server; the explicit layout's agent accepts no connection, which leaves a plan (and so
the gateway objects) in place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.control import agents
from tessera_operator import config
from tests.operator.conftest import GROUP, VERSION, create, custom, wait_for

pytestmark = pytest.mark.slow


def test_a_certificate_per_deployment(
    start_operator: Any, kube: client.ApiClient, tiny_llama: Path
) -> None:
    issuer = {"kind": "ClusterIssuer", "name": "tessera-ca"}
    tmpl = config.GatewayTemplate(certificate={"issuerRef": issuer, "duration": "720h"})
    start_operator([agents.AgentRef("agent-0", "127.0.0.1:9")], gateway=tmpl)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ServingDeployment",
        "metadata": {"name": "chat", "namespace": "default"},
        "spec": {
            "model": {"name": "tiny-llama", "path": str(tiny_llama)},
            "layout": {
                "mode": "explicit",
                "replicas": [{"name": "r0", "stages": [{"agent": "agent-0", "layers": [0, 8]}]}],
            },
        },
    }
    create(kube, body)

    def certificate() -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = custom(kube).get_namespaced_custom_object(
                "cert-manager.io", "v1", "default", "certificates", "chat-gateway-tls"
            )
        except client.ApiException:
            return None
        return obj

    cert = wait_for("the gateway Certificate", certificate)
    spec = cert["spec"]
    assert spec["uris"] == ["spiffe://tessera/ns/default/sd/chat"]
    assert spec["subject"] == {"organizationalUnits": ["gateway"]}
    assert spec["secretName"] == "chat-gateway-tls" and spec["duration"] == "720h"
    assert spec["issuerRef"] == {"group": "cert-manager.io", **issuer}
    assert cert["metadata"]["ownerReferences"][0]["name"] == "chat"
    gateway = wait_for(
        "the gateway Deployment",
        lambda: client.AppsV1Api(kube).list_namespaced_deployment("default").items,
    )[0]
    volumes = {v.name: v for v in gateway.spec.template.spec.volumes}
    assert volumes["tls"].secret.secret_name == "chat-gateway-tls"


def test_the_template_checks_its_issuer() -> None:
    with pytest.raises(ValueError, match="issuerRef"):
        config.GatewayTemplate(certificate={"issuerRef": {"kind": "Other", "name": "x"}})
    with pytest.raises(ValueError, match=r"gateway\.certificate\.days"):
        config.GatewayTemplate(
            certificate={"issuerRef": {"kind": "Issuer", "name": "x"}, "days": 3}
        )
