"""Kubernetes Events the operator records on a ServingDeployment (via kopf's event poster).

Called by `reconciler.py`: one event per transition step applied (`BlockLoaded`,
`BlockUnloaded`, `StageRewired`, `RoutesCutOver`, `ReplicaDrained`, or the `...Failed`
counterpart), one per gateway object written
(`GatewayCreated`, `GatewayUpdated`), and one per change of the Ready condition's reason
(`Serving` as Normal; `InvalidSpec`, `InsufficientCapacity`, `AgentUnreachable`,
`LoadFailed`, `Loading` as Warning except Loading). A timer pass that changes nothing
records nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from tessera.control import actuate
from tessera_operator import owned

# action kind -> (reason when done, reason when failed)
REASONS = {
    "LoadBlock": ("BlockLoaded", "BlockLoadFailed"),
    "UnloadBlock": ("BlockUnloaded", "BlockUnloadFailed"),
    "Rewire": ("StageRewired", "RewireFailed"),
    "CutOver": ("RoutesCutOver", "CutOverFailed"),
    "Drain": ("ReplicaDrained", "DrainFailed"),
    "MoveKV": ("KVMoved", "KVMoveFailed"),
    "ResizeKV": ("KVPoolResized", "KVPoolResizeFailed"),
    "DropLayers": ("LayersDropped", "LayersDropFailed"),
}


def action(body: kopf.Body, result: actuate.Result) -> None:
    """Record one applied step (a drain still waiting is recorded by status, not here)."""
    if result.waiting:
        return
    done, failed = REASONS.get(result.action.kind, ("StepDone", "StepFailed"))
    what = result.action.describe()
    if result.ok:
        note = f" ({result.message})" if result.message else ""
        kopf.info(body, reason=done, message=what + note)
    else:
        kopf.warn(body, reason=failed, message=f"{what}: {result.code}: {result.message}")


def applied(body: kopf.Body, result: owned.Applied) -> None:
    """Record a gateway object created or updated (unchanged ones are silent)."""
    if result.action != "unchanged":
        kopf.info(
            body,
            reason=f"Gateway{result.action.capitalize()}",
            message=f"{result.kind} {result.name} {result.action}",
        )


def transition(body: kopf.Body, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Record the Ready condition when its status or reason changes."""
    if (old.get("status"), old.get("reason")) == (new.get("status"), new.get("reason")):
        return
    reason, message = str(new.get("reason", "")), str(new.get("message", ""))
    if new.get("status") == "True" or reason in ("Loading", "Switching"):
        kopf.info(body, reason=reason, message=message)
    else:
        kopf.warn(body, reason=reason, message=message)


def switching(body: kopf.Body, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Record a transition starting (Progressing becomes Switching) and ending."""
    was, now = old.get("reason"), new.get("reason")
    if now == "Switching" and was != "Switching":
        kopf.info(body, reason="Switching", message=str(new.get("message", "")))
    elif was == "Switching" and now != "Switching":
        note = f" ({now}: {new.get('message', '')})" if now != "Serving" else ""
        kopf.info(body, reason="Switched", message="transition ended" + note)


def released(body: kopf.Body, message: str, ok: bool) -> None:
    """Record the finalizer's outcome."""
    if ok:
        kopf.info(body, reason="BlocksReleased", message=message)
    else:
        kopf.warn(body, reason="BlocksOrphaned", message=message)
