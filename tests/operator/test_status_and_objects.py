"""Pure parts of the operator: status and conditions, gateway objects, configuration."""

from __future__ import annotations

from typing import Any

import pytest

from tessera import api, observed, plan, routes_doc
from tessera.control import outcome
from tessera.policies.transition import planner as transition
from tessera_operator import config, gateway_objects, owned, status
from tests.operator import kstatus

DEP = api.ServingDeployment(
    "tiny",
    api.DeploymentSpec(
        model=api.ModelSpec("tiny-llama", pvc="models", sub_path="tiny"),
        workload=(api.WorkloadClass("chat", 100, 20),),
        gateway=api.GatewaySpec(port=8080, service_type="NodePort", replicas=2),
    ),
    namespace="team",
    generation=3,
)
PLAN = plan.Plan(
    "/models/tiny",
    "float32",
    (
        plan.PlannedReplica("team.tiny.r0", "r0", (plan.PlannedStage("a", "cpu:0", 0, 8),)),
        plan.PlannedReplica(
            "team.tiny.r1",
            "r1",
            (plan.PlannedStage("b", "cpu:0", 0, 4), plan.PlannedStage("a", "cpu:0", 4, 8)),
        ),
    ),
)


def _outcome(reason: str, ready: int = 2, with_plan: bool = True) -> outcome.Outcome:
    out = outcome.Outcome(reason, f"{reason} message", plan=PLAN if with_plan else None)
    out.ready_replicas = ["team.tiny.r0", "team.tiny.r1"][:ready]
    return out


def test_conditions_and_transition_times() -> None:
    first = status.build(_outcome("Loading", ready=1), 3, {}, "T1", "http://e")
    conds = {c["type"]: c for c in first["conditions"]}
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("False", "Loading")
    assert conds["Progressing"]["status"] == "True" and conds["PlanValid"]["reason"] == "Planned"
    assert first["phase"] == "Progressing" and first["readyReplicas"] == 1
    assert first["lastPlanTime"] == "T1" and first["observedGeneration"] == 3

    served = status.build(_outcome("Serving"), 3, first, "T2", "http://e")
    conds = {c["type"]: c for c in served["conditions"]}
    assert conds["Ready"]["lastTransitionTime"] == "T2"  # flipped
    assert conds["PlanValid"]["lastTransitionTime"] == "T1"  # unchanged
    assert conds["Degraded"]["lastTransitionTime"] == "T1"
    assert served["lastPlanTime"] == "T1"  # same plan
    again = status.build(_outcome("Serving"), 3, served, "T3", "http://e")
    assert status.merge_patch(served, again) == {}  # converged: nothing to write

    down = status.build(_outcome("AgentUnreachable", ready=1), 3, served, "T4", "http://e")
    conds = {c["type"]: c for c in down["conditions"]}
    assert conds["Degraded"]["status"] == "True" and conds["Degraded"]["reason"] == (
        "AgentUnreachable"
    )
    assert down["phase"] == "Degraded"

    invalid = status.build(_outcome("InvalidSpec", with_plan=False), 4, served, "T5", "")
    assert invalid["plan"] == served["plan"] and invalid["phase"] == "Invalid"
    assert status.condition(invalid, "PlanValid")["status"] == "False"
    assert status.merge_patch({"x": 1, "phase": "Ready"}, {"phase": "Invalid"}) == {
        "phase": "Invalid",
        "x": None,
    }


def _routed(*ids: str) -> routes_doc.RoutesDoc:
    return routes_doc.RoutesDoc(tuple(routes_doc.RouteReplica(i, "h:1") for i in ids), 2)


def _kstatus(st: dict[str, Any], generation: int = 3) -> str:
    return kstatus.compute({"metadata": {"generation": generation}, "status": st})


def test_transition_status_and_kstatus() -> None:
    """Switching with the old generation serving: Ready, Progressing/Switching with the
    step, Reconciling (InProgress); blocked: Ready, Stalled with the reason (Failed);
    done: Current."""
    old = routes_doc.RoutesDoc((routes_doc.RouteReplica("team.tiny.r0", "h:1"),), 1)
    world = transition.World(observed.Observed(), "team.tiny.", old)
    target = transition.Target(2, (), (routes_doc.RouteReplica("team.tiny.r1", "h:1"),))
    moving = outcome.Outcome("Switching", "generation 2: next: cut over", plan=PLAN)
    moving.routes, moving.serving = old, ["team.tiny.r0"]
    moving.remaining = transition.plan(world, target)
    st = status.build(moving, 3, {}, "T1", "")
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Ready"]["status"] == "True" and conds["Ready"]["reason"] == "Serving"
    assert (conds["Progressing"]["status"], conds["Progressing"]["reason"]) == (
        "True",
        "Switching",
    )
    assert conds["Reconciling"]["status"] == "True" and conds["Stalled"]["status"] == "False"
    assert st["transition"]["generation"] == 2 and st["transition"]["action"] == "CutOver"
    assert st["phase"] == "Progressing"
    assert _kstatus(st) == "InProgress" and _kstatus(st, generation=4) == "InProgress"

    stuck = outcome.Outcome("InsufficientMemory", "replica r1 needs 5 bytes", plan=PLAN)
    stuck.routes, stuck.serving = old, ["team.tiny.r0"]
    st = status.build(stuck, 3, st, "T2", "")
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Ready"]["status"] == "True"  # the old layout keeps serving
    assert "InsufficientMemory" in conds["Ready"]["message"]
    assert (conds["Stalled"]["status"], conds["Stalled"]["reason"]) == (
        "True",
        "InsufficientMemory",
    )
    assert conds["Reconciling"]["status"] == "False"
    assert st["phase"] == "Degraded" and "transition" not in st
    assert _kstatus(st) == "Failed"

    done = outcome.Outcome("Serving", "2 replicas serving", plan=PLAN)
    done.routes, done.serving = _routed("team.tiny.r1"), ["team.tiny.r1"]
    st = status.build(done, 3, st, "T3", "")
    assert _kstatus(st) == "Current" and status.condition(st, "Ready")["status"] == "True"
    # a routed replica lost (agent down): not a complete generation
    down = outcome.Outcome("AgentUnreachable", "agent b", plan=PLAN)
    down.routes, down.serving = _routed("team.tiny.r0", "team.tiny.r1"), ["team.tiny.r0"]
    st = status.build(down, 3, st, "T4", "")
    assert status.condition(st, "Ready")["status"] == "False" and _kstatus(st) == "Failed"


def test_gateway_objects() -> None:
    owner = gateway_objects.owner_reference({"metadata": {"name": "tiny", "uid": "u-1"}})
    doc = routes_doc.RoutesDoc(
        (
            routes_doc.RouteReplica("team.tiny.r0", "10.0.0.1:1"),
            routes_doc.RouteReplica("team.tiny.r1", "h:2"),
        ),
        version=3,
        drain_deadline_s=12.0,
        cut_over_at=5.0,
    )
    routes = gateway_objects.routes(DEP, PLAN, "/models/tiny", doc)
    assert routes["replicas"] == [
        {"id": "team.tiny.r0", "address": "10.0.0.1:1"},
        {"id": "team.tiny.r1", "address": "h:2"},
    ]
    assert (routes["version"], routes["drainDeadlineSeconds"], routes["cutOverAt"]) == (3, 12, 5)
    assert routes["classes"] == [{"name": "chat", "inputTokens": 100, "outputTokens": 20}]
    # the ConfigMap reads back as what was published
    cm = gateway_objects.config_map(DEP, {"name": "x"}, routes)
    assert gateway_objects.published(cm) == routes_doc.parse(routes)
    assert gateway_objects.published(cm) is not None
    assert gateway_objects.published(None) is None
    tmpl = config.GatewayTemplate.from_mapping(
        {
            "image": "reg/tessera:1",
            "imagePullSecrets": [{"name": "pull"}],
            "resources": {"limits": {"memory": "1Gi"}},
            "serviceAnnotations": {"a": "b"},
        }
    )
    dep = gateway_objects.deployment(DEP, owner, tmpl, "/models/tiny", "/models")
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2 and pod["imagePullSecrets"] == [{"name": "pull"}]
    assert pod["containers"][0]["image"] == "reg/tessera:1"
    assert pod["volumes"][1] == {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "models", "readOnly": True},
    }
    svc = gateway_objects.service(DEP, owner, tmpl)
    assert svc["spec"]["type"] == "NodePort" and svc["metadata"]["annotations"] == {"a": "b"}
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert gateway_objects.endpoint(DEP) == "http://tiny-gateway.team.svc:8080"
    assert owned.desired_hash(svc) == owned.desired_hash(gateway_objects.service(DEP, owner, tmpl))


def test_gateway_mounts_its_certificate_and_api_keys() -> None:
    owner = gateway_objects.owner_reference({"metadata": {"name": "tiny", "uid": "u-1"}})
    tmpl = config.GatewayTemplate.from_mapping(
        {
            "tlsSecretName": "tessera-gateway-tls",
            "apiKeysSecretName": "keys",
            "adminTokenSecretName": "admin",
            "extraArgs": ["--max-n", "4"],
        }
    )
    pod = gateway_objects.deployment(DEP, owner, tmpl, "/models/tiny", "/models")["spec"][
        "template"
    ]["spec"]
    c = pod["containers"][0]
    assert c["args"][-2:] == ["--max-n", "4"]
    assert {e["name"]: e["value"] for e in c["env"]} == {
        "TESSERA_TLS_DIR": "/var/run/tessera/tls",
        "TESSERA_API_KEYS_FILE": "/var/run/tessera/api-keys/keys",
        "TESSERA_ADMIN_TOKEN_FILE": "/var/run/tessera/admin-token/token",
    }
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"tls": "tessera-gateway-tls", "api-keys": "keys", "admin-token": "admin"}
    plain = gateway_objects.deployment(
        DEP, owner, config.GatewayTemplate(), "/models/tiny", "/models"
    )
    assert "env" not in plain["spec"]["template"]["spec"]["containers"][0]


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match=r"gateway\.imagePullPolicy"):
        config.GatewayTemplate(image_pull_policy="Sometimes")
    with pytest.raises(ValueError, match=r"gateway\.bogus: unknown key"):
        config.GatewayTemplate.from_mapping({"bogus": 1})
    with pytest.raises(ValueError, match="resync_seconds"):
        config.OperatorConfig(resync_seconds=0)
    with pytest.raises(ValueError, match="api_server"):
        config.OperatorConfig(api_server="localhost:8080")
    assert config.OperatorConfig().clusterwide
    assert not config.OperatorConfig(namespaces=("a",)).clusterwide


def test_operator_command_builds_its_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from tessera.cli import main as cli
    from tessera.cli import operator_cmd

    monkeypatch.setenv("TESSERA_AGENTS", "a=h:1,b=h:2")
    monkeypatch.setenv("TESSERA_GATEWAY_IMAGE", "reg/gw:2")
    args = cli.build_parser().parse_args(["operator", "-n", "x", "--resync", "3"])
    cfg = operator_cmd.build_config(args)
    assert [a.name for a in cfg.agents] == ["a", "b"] and cfg.namespaces == ("x",)
    assert cfg.gateway.image == "reg/gw:2" and cfg.resync_seconds == 3.0
