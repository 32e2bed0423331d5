"""What a ServingDeployment may ask of the cluster: model paths, Service type, hostPath (pure).

Inputs: the parsed spec, the checkpoint path the operator resolved from it, and the
operator's `Limits` (its configuration: the model roots, and whether LoadBalancer Services
and hostPath volumes are allowed). Called by the operator's reconcile pass before it plans
or creates anything (`tessera_operator.reconciler`); a refusal becomes the `Stalled` and
`Ready` conditions' reason, with the message naming the field.

Why: the operator creates the gateway's Deployment and Service with its own rights, so a
spec could otherwise mount any host directory into a pod (`spec.model.path` becomes a
hostPath volume) or open a cloud load balancer, and have agents read any checkpoint.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from tessera import api

MODEL_PATH_NOT_ALLOWED = "ModelPathNotAllowed"
SERVICE_TYPE_NOT_ALLOWED = "ServiceTypeNotAllowed"
HOST_PATH_NOT_ALLOWED = "HostPathNotAllowed"
REASONS = (MODEL_PATH_NOT_ALLOWED, SERVICE_TYPE_NOT_ALLOWED, HOST_PATH_NOT_ALLOWED)


@dataclass(frozen=True)
class Limits:
    """The operator's admission settings (`tessera operator --model-root/--allow-*`)."""

    model_roots: tuple[str, ...] = ("/models",)  # checkpoints must lie under one of these
    allow_load_balancer: bool = False  # spec.gateway.serviceType: LoadBalancer
    allow_host_path: bool = False  # a checkpoint outside a PVC: a hostPath on the gateway

    def __post_init__(self) -> None:
        if not self.model_roots:
            raise ValueError("model_roots: at least one root")
        for root in self.model_roots:
            if not posixpath.isabs(root) or posixpath.normpath(root) != root:
                raise ValueError(f"model_roots: {root!r} is not a normalised absolute path")


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str = ""  # one of REASONS when refused
    message: str = ""


ADMIT = Verdict(True)


def under(path: str, root: str) -> bool:
    """Is the absolute, normalised `path` the root or inside it?"""
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_path(path: str, roots: tuple[str, ...]) -> str:
    """Why `path` is not an allowed checkpoint folder ("" when it is)."""
    if not posixpath.isabs(path):
        return f"{path!r} must be an absolute path under {', '.join(roots)}"
    if posixpath.normpath(path) != path.rstrip("/") or "//" in path:
        return f"{path!r} must be normalised (no '.', '..' or empty segments)"
    if not any(under(path, root) for root in roots):
        return f"{path!r} is outside the allowed model roots ({', '.join(roots)})"
    return ""


def admit(spec: api.DeploymentSpec, model_path: str, limits: Limits) -> Verdict:
    """May the operator serve `spec`, whose checkpoint resolves to `model_path`?"""
    m = spec.model
    problem = check_path(model_path, limits.model_roots)
    if problem:
        field = "spec.model.subPath" if m.pvc and m.sub_path else "spec.model.path"
        return Verdict(False, MODEL_PATH_NOT_ALLOWED, f"{field}: {problem}")
    if not m.pvc and not limits.allow_host_path:
        return Verdict(
            False,
            HOST_PATH_NOT_ALLOWED,
            "spec.model.path: a checkpoint outside a PVC is mounted into the gateway as a "
            "hostPath volume, which this operator does not allow (set spec.model.pvc, or "
            "start the operator with --allow-host-path)",
        )
    if spec.gateway.service_type == "LoadBalancer" and not limits.allow_load_balancer:
        return Verdict(
            False,
            SERVICE_TYPE_NOT_ALLOWED,
            "spec.gateway.serviceType: LoadBalancer is not allowed by this operator "
            "(start it with --allow-load-balancer)",
        )
    return ADMIT
