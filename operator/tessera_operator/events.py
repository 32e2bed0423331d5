"""Kubernetes Events the operator records on a ServingDeployment (via kopf's event poster).

Called by `reconciler.py`: one event per block action (`BlockLoaded`, `BlockUnloaded`,
`BlockLoadFailed`, `BlockUnloadFailed`), one per gateway object written
(`GatewayCreated`, `GatewayUpdated`), and one per change of the Ready condition's reason
(`Serving` as Normal; `InvalidSpec`, `InsufficientCapacity`, `AgentUnreachable`,
`LoadFailed`, `Loading` as Warning except Loading). A timer pass that changes nothing
records nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from tessera import reconcile
from tessera_operator import actuate, owned


def action(body: kopf.Body, result: actuate.Result) -> None:
    """Record one applied block action."""
    load = isinstance(result.action, reconcile.LoadBlock)
    what = result.action.describe()
    if result.ok:
        note = f" ({result.message})" if result.message else ""
        kopf.info(body, reason="BlockLoaded" if load else "BlockUnloaded", message=what + note)
    else:
        kopf.warn(
            body,
            reason="BlockLoadFailed" if load else "BlockUnloadFailed",
            message=f"{what}: {result.code}: {result.message}",
        )


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
    if new.get("status") == "True" or reason == "Loading":
        kopf.info(body, reason=reason, message=message)
    else:
        kopf.warn(body, reason=reason, message=message)


def released(body: kopf.Body, message: str, ok: bool) -> None:
    """Record the finalizer's outcome."""
    if ok:
        kopf.info(body, reason="BlocksReleased", message=message)
    else:
        kopf.warn(body, reason="BlocksOrphaned", message=message)
