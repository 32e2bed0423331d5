"""The chart's mutual TLS: on by default (user-supplied Secrets), cert-manager objects when
toggled, the gateway template the operator receives, and plaintext only when asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.chart import chart_check as cc
from tests.chart.test_chart_render import container, one, render

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def helm() -> Path:
    return cc.helm_binary()


def _tls_secret(workload: dict[str, object]) -> str:
    pod = workload["spec"]["template"]["spec"]  # type: ignore[index]
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container(workload)["volumeMounts"]}
    assert mounts["tls"]["mountPath"] == "/var/run/tessera/tls" and mounts["tls"]["readOnly"]
    env = {e["name"]: e.get("value") for e in container(workload)["env"]}
    assert env["TESSERA_TLS_DIR"] == "/var/run/tessera/tls"
    return str(vols["tls"]["secret"]["secretName"])


def test_tls_is_on_by_default_with_user_supplied_secrets(helm: Path) -> None:
    objects = render(helm)
    assert _tls_secret(one(objects, "Deployment", "operator")) == "tessera-operator-tls"
    assert _tls_secret(one(objects, "DaemonSet", "agent")) == "tessera-agent-tls"
    gateway = json.loads(one(objects, "ConfigMap")["data"]["gateway.json"])
    assert gateway["tlsSecretName"] == "tessera-gateway-tls"
    assert not [o for o in objects if o["apiVersion"].startswith("cert-manager.io")]
    assert one(objects, "NetworkPolicy", "agent")["spec"]["policyTypes"] == ["Ingress", "Egress"]
    named = render(helm, "tls.secrets.agent=my-agent-cert")
    assert _tls_secret(one(named, "DaemonSet", "agent")) == "my-agent-cert"


def test_plaintext_only_when_turned_off(helm: Path) -> None:
    objects = render(helm, "tls.enabled=false")
    c = container(one(objects, "DaemonSet", "agent"))
    assert "--health-port" not in c["args"] and "TESSERA_TLS_DIR" not in str(c["env"])
    assert c["livenessProbe"]["grpc"] == {"port": 50051}
    gateway = json.loads(one(objects, "ConfigMap")["data"]["gateway.json"])
    assert gateway["tlsSecretName"] == ""


def test_cert_manager_issues_one_certificate_per_role(helm: Path) -> None:
    # per namespace for gateways here; per ServingDeployment (the default) in
    # tests/chart/test_chart_tenancy.py
    objects = render(helm, "tls.certManager.perDeployment=false", files=[cc.ALL_ON])
    certs = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"]
        for o in objects
        if o["kind"] == "Certificate"
    }
    roles = {k: v.get("subject", {}).get("organizationalUnits") for k, v in certs.items()}
    assert roles == {
        ("cert-manager", "tessera-ca"): None,
        ("tessera-system", "tessera-operator-tls"): ["operator"],
        ("tessera-system", "tessera-agent-tls"): ["agent"],
        ("serving", "tessera-gateway-tls"): ["gateway"],
        ("serving-canary", "tessera-gateway-tls"): ["gateway"],
    }
    assert certs[("cert-manager", "tessera-ca")]["isCA"] is True
    # gateways are bound to their namespace (tessera.policies.security.tenancy); no other role is
    for (ns, _), spec in certs.items():
        gateway = spec.get("subject", {}).get("organizationalUnits") == ["gateway"]
        assert spec.get("uris") == ([f"spiffe://tessera/ns/{ns}"] if gateway else None)
    agent = certs[("tessera-system", "tessera-agent-tls")]
    assert agent["dnsNames"] == ["tessera-agent"]  # transport.AGENT_SERVER_NAME
    assert {"server auth", "client auth"} <= set(agent["usages"])
    assert agent["issuerRef"] == {"group": "cert-manager.io", "kind": "ClusterIssuer",
                                  "name": "tessera-ca"}  # fmt: skip
    issuers = sorted(o["metadata"]["name"] for o in objects if o["kind"] == "ClusterIssuer")
    assert issuers == ["tessera-ca", "tessera-selfsigned"]
    # a user's issuer replaces the chart's self-signed chain
    own = render(
        helm,
        "tls.certManager.enabled=true",
        "tls.certManager.issuerRef.kind=ClusterIssuer",
        "tls.certManager.issuerRef.name=corp-ca",
    )
    assert not [o for o in own if o["kind"] == "ClusterIssuer"]
    kinds = sorted(o["kind"] for o in own if o["apiVersion"].startswith("cert-manager.io"))
    assert kinds == ["Certificate", "Certificate"]  # no watched namespaces: no gateway cert


def test_gateway_template_carries_keys_limits_and_tls(helm: Path) -> None:
    from tessera.cli import main
    from tessera_operator import config

    objects = render(helm, files=[cc.ALL_ON])
    doc = json.loads(one(objects, "ConfigMap")["data"]["gateway.json"])
    tmpl = config.GatewayTemplate.from_mapping(doc)
    assert tmpl.api_keys_secret_name == "tessera-api-keys"
    assert tmpl.tls_secret_name == "tessera-gateway-tls"
    args = main.build_parser().parse_args(["gateway", *tmpl.extra_args])
    assert (args.max_tokens_limit, args.max_n, args.max_concurrent_per_key) == (1024, 4, 16)


def test_tls_misconfigurations_fail(helm: Path) -> None:
    with pytest.raises(cc.CheckError, match=r"tls\.certManager\.enabled needs tls\.enabled"):
        render(helm, "tls.enabled=false", "tls.certManager.enabled=true")
    with pytest.raises(cc.CheckError, match="healthPort"):
        render(helm, "agent.healthPort=50051")
