"""The chart's tenancy hardening (issue 31): default-deny NetworkPolicies with egress rules
and peers matched by namespace and labels; the operator's RBAC namespaced when it watches
given namespaces; admission flags; the TLS-off warning in NOTES.txt."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.chart import chart_check as cc

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def helm() -> Path:
    return cc.helm_binary()


def _policies(objects: Sequence[Obj]) -> dict[tuple[str, str], Obj]:
    return {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"]
        for o in objects
        if o["kind"] == "NetworkPolicy"
    }


def _peers(spec: Obj) -> list[Obj]:
    rules = [*spec.get("ingress", []), *spec.get("egress", [])]
    return [p for r in rules for p in (r.get("from", []) + r.get("to", []))]


@pytest.mark.parametrize("version", cc.KUBE_VERSIONS)
def test_default_deny_policies_render_and_validate(helm: Path, version: str) -> None:
    objects = cc.template(helm, kube_version=version)
    assert cc.validate_objects(objects, version) == []
    policies = _policies(objects)
    ns = cc.NAMESPACE
    deny = policies[(ns, "tessera-default-deny")]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    for name in ("tessera-agent", "tessera-operator"):
        spec = policies[(ns, name)]
        assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["egress"], name
        for peer in _peers(spec):  # pods by namespace AND labels; the API server by address
            assert "ipBlock" in peer or {"namespaceSelector", "podSelector"} <= set(peer), peer
    operator = policies[(ns, "tessera-operator")]
    assert operator["ingress"] == []
    ports = {p["port"] for r in operator["egress"] for p in r.get("ports", [])}
    assert {50051, 443, 6443, 53} <= ports
    # DNS is open to each; the agents' egress goes to agents and DNS only
    agent_egress = policies[(ns, "tessera-agent")]["egress"]
    assert [r["to"][0]["podSelector"]["matchLabels"] for r in agent_egress] == [
        {"app.kubernetes.io/name": "tessera", "app.kubernetes.io/instance": "tessera",
         "app.kubernetes.io/component": "agent"},
        {"k8s-app": "kube-dns"},
    ]  # fmt: skip
    off = _policies(cc.template(helm, set_values=["networkPolicy.defaultDeny=false"]))
    assert (ns, "tessera-default-deny") not in off and (ns, "tessera-agent") in off
    assert _policies(cc.template(helm, set_values=["networkPolicy.enabled=false"])) == {}


def test_watched_namespaces_get_gateway_policies(helm: Path) -> None:
    objects = cc.template(helm, (cc.ALL_ON,))
    assert cc.validate_objects(objects, cc.KUBE_VERSIONS[-1]) == []
    policies = _policies(objects)
    for ns in ("serving", "serving-canary"):
        spec = policies[(ns, "tessera-gateway")]
        assert spec["policyTypes"] == ["Ingress", "Egress"]
        to_agents, dns = spec["egress"]
        assert to_agents["ports"] == [{"port": 50051, "protocol": "TCP"}]
        assert to_agents["to"][0]["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": cc.NAMESPACE}
        }
        assert dns["ports"][0]["port"] == 53
    assert not [k for k in _policies(cc.template(helm)) if k[0] != cc.NAMESPACE]


def _rbac(objects: Sequence[Obj]) -> dict[tuple[str, str, str], list[Obj]]:
    return {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o.get("rules", [])
        for o in objects
        if o["kind"] in ("ClusterRole", "Role")
    }


def test_rbac_is_namespaced_with_watch_namespaces(helm: Path) -> None:
    watched = cc.template(helm, set_values=["operator.watchNamespaces={team-a,team-b}"])
    roles = _rbac(watched)
    cluster = roles[("ClusterRole", "", "tessera-operator")]
    assert cc.granted(cluster) == {cc.Perm("list", "", "nodes")}  # nothing namespaced
    for ns in ("team-a", "team-b"):
        granted = cc.granted(roles[("Role", ns, "tessera-operator")])
        assert cc.Perm("create", "apps", "deployments") in granted
        assert cc.Perm("watch", "serving.tessera.dev", "servingdeployments") in granted
        bindings = [
            o for o in watched if o["kind"] == "RoleBinding" and o["metadata"]["namespace"] == ns
        ]
        assert [b["roleRef"]["kind"] for b in bindings] == ["Role"]
        assert bindings[0]["subjects"][0]["namespace"] == cc.NAMESPACE
    # what the operator can do is still exactly what it was recorded doing
    assert cc.rbac_problems(watched, cc.load_usage()) == []
    everywhere = _rbac(cc.template(helm))[("ClusterRole", "", "tessera-operator")]
    assert cc.Perm("create", "apps", "deployments") in cc.granted(everywhere)


def _operator_args(objects: Sequence[Obj]) -> list[str]:
    deployment = cc._one(objects, "Deployment", "operator")
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def test_admission_flags_follow_the_values(helm: Path) -> None:
    args = _operator_args(cc.template(helm))
    assert "--allow-host-path" in args and "--allow-load-balancer" not in args
    assert "--allowed-model-root" not in args  # the CLI's default: --model-root alone
    pvc = _operator_args(
        cc.template(helm, set_values=["modelCache.type=pvc", "modelCache.pvc.claimName=c"])
    )
    assert "--allow-host-path" not in pvc
    custom = _operator_args(
        cc.template(
            helm,
            set_values=[
                "operator.admission.allowLoadBalancer=true",
                "operator.admission.allowHostPath=false",
                "operator.admission.allowedModelRoots={/models,/srv/ckpt}",
            ],
        )
    )
    assert "--allow-load-balancer" in custom and "--allow-host-path" not in custom
    roots = [custom[i + 1] for i, a in enumerate(custom) if a == "--allowed-model-root"]
    assert roots == ["/models", "/srv/ckpt"]
    with pytest.raises(cc.CheckError):
        cc.template(helm, set_values=["operator.admission.allowedModelRoots={models}"])


def test_notes_warn_when_tls_is_off(helm: Path) -> None:
    def notes(*sets: str) -> str:
        args = ["install", cc.RELEASE, str(cc.CHART), "--dry-run=client", "-n", cc.NAMESPACE]
        for s in sets:
            args += ["--set", s]
        return cc.run_helm(helm, *args)

    assert "WARNING: tls.enabled is false" in notes("tls.enabled=false")
    assert "WARNING" not in notes()
    # no admin token: the operator cannot push routes changes to the gateways
    assert "cannot push routes" in notes()
    assert "cannot push routes" not in notes("gateway.adminToken.secretName=gw-admin")


def test_a_gateway_secret_per_deployment_is_passed_through(helm: Path, tmp_path: Path) -> None:
    import json

    values = tmp_path / "v.yaml"
    values.write_text('tls: {secrets: {gateway: "{name}-gateway-tls"}}\n')
    objects = cc.template(helm, (values,))
    defaults = next(o for o in objects if o["kind"] == "ConfigMap")
    assert json.loads(defaults["data"]["gateway.json"])["tlsSecretName"] == "{name}-gateway-tls"
    with pytest.raises(cc.CheckError, match="needs certManager off"):
        cc.template(helm, (values,), ["tls.certManager.enabled=true"])


def test_operator_and_gateways_reach_the_agents_it_discovers(helm: Path, tmp_path: Path) -> None:
    values = tmp_path / "v.yaml"
    values.write_text(
        "operator: {agentSelector: 'pool=gpu,team=ml', agentNamespace: gpu-agents,"
        " watchNamespaces: [serving]}\nagent: {enabled: false}\n"
    )
    policies = _policies(cc.template(helm, (values,)))
    assert (cc.NAMESPACE, "tessera-agent") not in policies  # no agents of ours to guard
    want = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gpu-agents"}},
        "podSelector": {"matchLabels": {"pool": "gpu", "team": "ml"}},
    }
    assert policies[(cc.NAMESPACE, "tessera-operator")]["egress"][0]["to"] == [want]
    assert policies[("serving", "tessera-gateway")]["egress"][0]["to"] == [want]
    values.write_text("operator: {agentSelector: 'pool in (a, b)'}\n")
    with pytest.raises(cc.CheckError, match="key=value pairs"):
        cc.template(helm, (values,))


def test_cert_manager_gateway_certificates_are_per_deployment(helm: Path) -> None:
    import json

    objects = cc.template(helm, (cc.ALL_ON,))
    assert cc.validate_objects(objects, cc.KUBE_VERSIONS[-1]) == []
    defaults = next(o for o in objects if o["kind"] == "ConfigMap" and "gateway.json" in o["data"])
    template = json.loads(defaults["data"]["gateway.json"])
    assert template["certificate"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "tessera-ca"}
    # the operator issues them: no gateway Certificate per namespace, and it may create them
    gateways = [
        o
        for o in objects
        if o["kind"] == "Certificate"
        and o["spec"].get("subject", {}).get("organizationalUnits") == ["gateway"]
    ]
    assert gateways == []
    perm = cc.Perm("create", "cert-manager.io", "certificates")
    roles = _rbac(objects)
    assert perm in cc.granted(roles[("Role", "serving", "tessera-operator")])
    assert cc.rbac_problems(objects, cc.load_usage()) == []
    # without cert-manager the operator gets no right on Certificates
    plain = cc.template(helm, set_values=["operator.watchNamespaces={serving}"])
    assert perm not in cc.granted(_rbac(plain)[("Role", "serving", "tessera-operator")])
    assert cc.rbac_problems(plain, cc.load_usage()) == []
