"""The gateway of a ServingDeployment as Kubernetes objects: routes ConfigMap, Deployment, Service.

Pure builders called by `reconciler.py`; `owned.py` creates or replaces them. All three are
owned by the custom resource (ownerReferences, so Kubernetes deletes them with it) and
named `<deployment>-gateway[-routes]`. The gateway container runs
`tessera gateway --routes /etc/tessera/routes.json` (`tessera.gateway.routes` describes the
file) and reads the tokenizer from the model folder, mounted as the agents see it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from tessera import api, plan, routes_doc
from tessera.control import converge
from tessera_operator import config, gateway_certificate

ROUTES_DIR = "/etc/tessera"
ROUTES_KEY = "routes.json"
TLS_DIR = "/var/run/tessera/tls"  # the gateway's client certificate (TESSERA_TLS_DIR)
API_KEYS_DIR = "/var/run/tessera/api-keys"
ADMIN_TOKEN_DIR = "/var/run/tessera/admin-token"
LABEL_DEPLOYMENT = f"{api.API_GROUP}/deployment"


def gateway_name(dep: api.ServingDeployment) -> str:
    return f"{dep.name}-gateway"


def routes_name(dep: api.ServingDeployment) -> str:
    return f"{dep.name}-gateway-routes"


def endpoint(dep: api.ServingDeployment) -> str:
    """The gateway's in-cluster URL (status.endpoint)."""
    return f"http://{gateway_name(dep)}.{dep.namespace}.svc:{dep.spec.gateway.port}"


def selector(dep: api.ServingDeployment) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "tessera",
        "app.kubernetes.io/component": "gateway",
        "app.kubernetes.io/instance": dep.name,
    }


def labels(dep: api.ServingDeployment) -> dict[str, str]:
    return {
        **selector(dep),
        "app.kubernetes.io/managed-by": "tessera-operator",
        LABEL_DEPLOYMENT: dep.name,
    }


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    """The custom resource as the controlling owner of what the operator creates."""
    meta = body["metadata"]
    return {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def routes(
    dep: api.ServingDeployment, p: plan.Plan | None, model_path: str, doc: routes_doc.RoutesDoc
) -> dict[str, Any]:
    """The routes document (`tessera.routes_doc`) as JSON: `converge.filled(...)`."""
    return converge.filled(dep, p, model_path, doc).to_json()


def published(config_map_obj: Mapping[str, Any] | None) -> routes_doc.RoutesDoc | None:
    """The routes document a routes ConfigMap holds (None: absent or unreadable, which the
    next cut-over replaces)."""
    if config_map_obj is None:
        return None
    raw = (config_map_obj.get("data") or {}).get(ROUTES_KEY)
    if not raw:
        return None
    try:
        return routes_doc.parse(json.loads(raw))
    except ValueError:
        return None


def _meta(dep: api.ServingDeployment, name: str, owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": dep.namespace,
        "labels": labels(dep),
        "ownerReferences": [owner],
    }


def config_map(
    dep: api.ServingDeployment, owner: dict[str, Any], routes_doc: dict[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(dep, routes_name(dep), owner),
        "data": {ROUTES_KEY: json.dumps(routes_doc, indent=2, sort_keys=True) + "\n"},
    }


def _model_volume(
    dep: api.ServingDeployment, model_path: str, model_root: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, mount) that show the checkpoint at `model_path` inside the gateway pod."""
    m = dep.spec.model
    if m.pvc:
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": m.pvc, "readOnly": True}}
        return volume, {"name": "model", "mountPath": model_root, "readOnly": True}
    folder = str(PurePosixPath(model_path))
    volume = {"name": "model", "hostPath": {"path": folder, "type": "Directory"}}
    return volume, {"name": "model", "mountPath": folder, "readOnly": True}


def deployment(
    dep: api.ServingDeployment,
    owner: dict[str, Any],
    tmpl: config.GatewayTemplate,
    model_path: str,
    model_root: str,
) -> dict[str, Any]:
    port = dep.spec.gateway.port
    model_volume, model_mount = _model_volume(dep, model_path, model_root)
    container: dict[str, Any] = {
        "name": "gateway",
        "image": tmpl.image,
        "imagePullPolicy": tmpl.image_pull_policy,
        "args": [
            "gateway",
            "--routes",
            f"{ROUTES_DIR}/{ROUTES_KEY}",
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
        ],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {
            # scaled to zero the gateway must stay in the Service to hold and wake (issue 32)
            "httpGet": {
                "path": "/metrics" if dep.spec.scaling.enabled else "/health",
                "port": "http",
            },
            "periodSeconds": 5,
        },
        "volumeMounts": [
            {"name": "routes", "mountPath": ROUTES_DIR, "readOnly": True},
            model_mount,
        ],
    }
    if dep.spec.scaling.enabled:  # the hold queue of spec.scaling.hold (issue 32)
        h = dep.spec.scaling.hold
        container["args"] += ["--hold-max", str(h.max_requests)]
        container["args"] += ["--hold-deadline", f"{h.deadline_seconds:g}"]
    container["args"] += list(tmpl.extra_args)
    volumes = [{"name": "routes", "configMap": {"name": routes_name(dep)}}, model_volume]
    env: list[dict[str, Any]] = []
    for volume, folder, variable, value in (
        ("tls", TLS_DIR, "TESSERA_TLS_DIR", TLS_DIR),
        ("api-keys", API_KEYS_DIR, "TESSERA_API_KEYS_FILE", f"{API_KEYS_DIR}/keys"),
        ("admin-token", ADMIN_TOKEN_DIR, "TESSERA_ADMIN_TOKEN_FILE", f"{ADMIN_TOKEN_DIR}/token"),
    ):
        secret = {
            "tls": tmpl.tls_secret_name,
            "api-keys": tmpl.api_keys_secret_name,
            "admin-token": tmpl.admin_token_secret_name,
        }[volume]
        # "{name}": one Secret per ServingDeployment, e.g. a certificate bound to it by its
        # URI SAN (tessera.policies.security.tenancy) rather than to its whole namespace
        secret = secret.replace("{name}", dep.name)
        if volume == "tls" and tmpl.certificate:  # the operator's certificate for it
            secret = gateway_certificate.secret_name(dep)
        if secret:
            volumes.append({"name": volume, "secret": {"secretName": secret}})
            container["volumeMounts"].append(
                {"name": volume, "mountPath": folder, "readOnly": True}
            )
            env.append({"name": variable, "value": value})
    if env:
        container["env"] = env
    if tmpl.resources:
        container["resources"] = dict(tmpl.resources)
    if tmpl.security_context:
        container["securityContext"] = dict(tmpl.security_context)
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "automountServiceAccountToken": tmpl.automount_service_account_token,
        "volumes": volumes,
    }
    optional = {
        "serviceAccountName": tmpl.service_account_name,
        "priorityClassName": tmpl.priority_class_name,
        "nodeSelector": dict(tmpl.node_selector),
        "tolerations": [dict(t) for t in tmpl.tolerations],
        "affinity": dict(tmpl.affinity),
        "securityContext": dict(tmpl.pod_security_context),
        "imagePullSecrets": [{"name": s} for s in tmpl.image_pull_secrets],
    }
    pod_spec.update({k: v for k, v in optional.items() if v})
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(dep, gateway_name(dep), owner),
        "spec": {
            "replicas": dep.spec.gateway.replicas,
            "selector": {"matchLabels": selector(dep)},
            "template": {
                "metadata": {
                    "labels": {**labels(dep), **tmpl.pod_labels},
                    "annotations": dict(tmpl.pod_annotations),
                },
                "spec": pod_spec,
            },
        },
    }


def service(
    dep: api.ServingDeployment, owner: dict[str, Any], tmpl: config.GatewayTemplate
) -> dict[str, Any]:
    meta = _meta(dep, gateway_name(dep), owner)
    if tmpl.service_annotations:
        meta["annotations"] = dict(tmpl.service_annotations)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": dep.spec.gateway.service_type,
            "selector": selector(dep),
            "ports": [
                {
                    "name": "http",
                    "port": dep.spec.gateway.port,
                    "targetPort": "http",
                    "protocol": "TCP",
                }
            ],
        },
    }
