"""The operator's admission of a spec (`policies.security.admission`), pure: model paths
the allowed roots, LoadBalancer and hostPath only when allowed; and the CRD's path pattern."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera import api
from tessera.policies.security import admission

CRD = Path(__file__).parents[2] / "crds/servingdeployments.serving.tessera.dev.yaml"
STRICT = admission.Limits(("/models",))


def _spec(model: dict[str, Any], service_type: str = "ClusterIP") -> api.DeploymentSpec:
    doc = {
        "apiVersion": "serving.tessera.dev/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": "d", "namespace": "ns"},
        "spec": {"model": {"name": "m", **model}, "gateway": {"serviceType": service_type}},
    }
    return api.parse(doc).spec


@pytest.mark.parametrize(
    "path", ["/etc", "/models/../etc", "/models/./x", "/models//x", "relative/x", "/modelsx/a"]
)
def test_paths_outside_the_roots_are_refused_naming_the_field(path: str) -> None:
    v = admission.admit(_spec({"path": path}), path, admission.Limits(("/models",), True, True))
    assert not v.allowed and v.reason == admission.MODEL_PATH_NOT_ALLOWED
    assert v.message.startswith("spec.model.path: ")


def test_pvc_paths_hostpath_and_load_balancers() -> None:
    pvc = _spec({"pvc": "cache", "subPath": "llama"})
    assert admission.admit(pvc, "/models/llama", STRICT).allowed
    escaped = admission.admit(_spec({"pvc": "c", "subPath": "../etc"}), "/models/../etc", STRICT)
    assert escaped.reason == admission.MODEL_PATH_NOT_ALLOWED
    assert escaped.message.startswith("spec.model.subPath")
    host = admission.admit(_spec({"path": "/models/llama"}), "/models/llama", STRICT)
    assert host.reason == admission.HOST_PATH_NOT_ALLOWED and "--allow-host-path" in host.message
    lb = _spec({"pvc": "cache", "subPath": "llama"}, "LoadBalancer")
    refused = admission.admit(lb, "/models/llama", STRICT)
    assert refused.reason == admission.SERVICE_TYPE_NOT_ALLOWED
    assert "spec.gateway.serviceType" in refused.message
    assert admission.admit(lb, "/models/llama", admission.Limits(allow_load_balancer=True)).allowed
    two_roots = admission.Limits(("/models", "/srv/ckpt"), allow_host_path=True)
    assert admission.admit(_spec({"path": "/srv/ckpt/a"}), "/srv/ckpt/a", two_roots).allowed
    with pytest.raises(ValueError):
        admission.Limits(("models",))
    with pytest.raises(ValueError):
        admission.Limits(())


def test_the_crd_refuses_dot_segments_in_model_paths() -> None:
    doc = yaml.safe_load(CRD.read_text())
    model = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props = model["properties"]["model"]["properties"]
    path, sub_path = (re.compile(props[f]["pattern"]) for f in ("path", "subPath"))
    for ok in ("models/llama-2", "llama/v1", "models/.cache/x", "a/..b/"):
        assert path.search(ok) and sub_path.search(ok) and path.search("/" + ok), ok
    assert not sub_path.search("/models/llama")  # a subPath is inside the PVC
    for bad in ("/models/../etc", "/a/./b", "/a//b", "/", ".", "/a b", "/..", "a/./b"):
        assert not path.search(bad) and not sub_path.search(bad), bad
    # relative paths are `tessera up`'s (from the manifest's folder): they may climb out of
    # it; a PVC's subPath never may
    assert path.search("../.demo/tiny-llama") and not sub_path.search("../etc")


def test_a_gateway_secret_per_deployment() -> None:
    """`tlsSecretName: "{name}-gateway-tls"`: each deployment's gateway mounts its own
    certificate (one bound to it by its URI SAN)."""
    from tessera_operator import config, gateway_objects

    dep = api.parse(
        {
            "apiVersion": "serving.tessera.dev/v1alpha1",
            "kind": "ServingDeployment",
            "metadata": {"name": "chat", "namespace": "team-a"},
            "spec": {"model": {"name": "m", "pvc": "cache", "subPath": "m"}},
        }
    )
    tmpl = config.GatewayTemplate.from_mapping({"tlsSecretName": "{name}-gateway-tls"})
    owner = gateway_objects.owner_reference({"metadata": {"name": "chat", "uid": "u"}})
    pod = gateway_objects.deployment(dep, owner, tmpl, "/models/m", "/models")["spec"]["template"]
    secrets = [v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v]
    assert secrets == ["chat-gateway-tls"]


def test_operator_flags_build_the_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    from tessera.cli import main as cli
    from tessera.cli import operator_cmd

    for var in ("TESSERA_ALLOWED_MODEL_ROOTS", "TESSERA_ALLOW_LOAD_BALANCER",
                "TESSERA_ALLOW_HOST_PATH", "TESSERA_MODEL_ROOT"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)

    def limits(*argv: str) -> admission.Limits:
        args = cli.build_parser().parse_args(["operator", "--agent", "a=h:1", *argv])
        found: admission.Limits = operator_cmd.build_config(args).admission
        return found

    assert limits() == admission.Limits(("/models",))  # strict unless told
    assert limits("--model-root", "/srv/m").model_roots == ("/srv/m",)
    told = limits("--allowed-model-root", "/a", "--allowed-model-root", "/b",
                  "--allow-load-balancer", "--allow-host-path")  # fmt: skip
    assert told == admission.Limits(("/a", "/b"), True, True)
    monkeypatch.setenv("TESSERA_ALLOWED_MODEL_ROOTS", "/x, /y")
    monkeypatch.setenv("TESSERA_ALLOW_HOST_PATH", "true")
    assert limits() == admission.Limits(("/x", "/y"), allow_host_path=True)
