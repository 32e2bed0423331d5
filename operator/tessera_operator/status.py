"""The ServingDeployment status from one reconcile pass: conditions, phase, plan, endpoint.

Pure; called by `reconciler.py`, which writes the result last, as a merge patch of only
what changed (`merge_patch`), so a converged pass writes nothing. Conditions:

* `Ready`: True (reason Serving) when every planned replica has all its blocks loaded;
  else False with the pass's reason (InvalidSpec, InsufficientCapacity,
  AgentUnreachable, LoadFailed, Loading).
* `Progressing`: True (reason Loading) while blocks are being loaded; else False.
* `Degraded`: True when an agent is unreachable or a load failed after a plan exists.
* `PlanValid`: True (reason Planned) when a plan was made; else False with the reason.

`lastTransitionTime` changes only when a condition's status flips.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tessera_operator import converge

CONDITIONS = ("Ready", "Progressing", "Degraded", "PlanValid")
PHASES = {
    "Serving": "Ready",
    "Loading": "Progressing",
    "InvalidSpec": "Invalid",
    "InsufficientCapacity": "Pending",
    "AgentUnreachable": "Degraded",
    "LoadFailed": "Degraded",
}


def _wanted(out: converge.Outcome) -> dict[str, tuple[bool, str, str]]:
    """type -> (status, reason, message) for this pass."""
    reason, msg = out.reason, out.message
    degraded = reason in ("AgentUnreachable", "LoadFailed") or (
        reason == "InsufficientCapacity" and out.plan is not None
    )
    planned = out.plan is not None
    plan_msg = (
        f"{len(out.plan.replicas)} replicas ({out.plan.source})"
        + (f": {out.plan.message}" if out.plan.message else "")
        if out.plan is not None
        else msg
    )
    return {
        "Ready": (reason == "Serving", reason, msg),
        "Progressing": (reason == "Loading", reason, msg),
        "Degraded": (degraded, reason if degraded else "AsExpected", msg if degraded else ""),
        "PlanValid": (planned, "Planned" if planned else reason, plan_msg),
    }


def conditions(
    out: converge.Outcome,
    generation: int,
    previous: Sequence[Mapping[str, Any]],
    now: str,
) -> list[dict[str, Any]]:
    """The four conditions, keeping each one's lastTransitionTime unless its status flips."""
    before = {c.get("type"): c for c in previous}
    result = []
    for ctype, (ok, reason, message) in _wanted(out).items():
        status = "True" if ok else "False"
        old = before.get(ctype)
        since = old.get("lastTransitionTime") if old and old.get("status") == status else None
        result.append(
            {
                "type": ctype,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": since or now,
                "observedGeneration": generation,
            }
        )
    return result


def build(
    out: converge.Outcome,
    generation: int,
    previous: Mapping[str, Any],
    now: str,
    endpoint: str,
) -> dict[str, Any]:
    """The full status after a pass. Without a plan (invalid spec, no capacity) the last
    plan and replica counts stay: the blocks it loaded keep serving."""
    status: dict[str, Any] = {
        key: previous[key]
        for key in ("plan", "replicas", "readyReplicas", "lastPlanTime", "endpoint")
        if key in previous
    }
    if out.plan is not None:
        plan_doc: dict[str, Any] = {"source": out.plan.source, "replicas": out.plan.to_status()}
        if out.plan.message:
            plan_doc["message"] = out.plan.message
        if previous.get("plan") != plan_doc or "lastPlanTime" not in previous:
            status["lastPlanTime"] = now
        status["plan"] = plan_doc
        status["replicas"] = len(out.plan.replicas)
        status["readyReplicas"] = len(out.ready_replicas)
        status["endpoint"] = endpoint
    status["observedGeneration"] = generation
    status["phase"] = PHASES.get(out.reason, "Pending")
    status["conditions"] = conditions(out, generation, previous.get("conditions") or [], now)
    return status


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level merge patch from `old` to `new` (None removes a key); {} if equal."""
    patch: dict[str, Any] = {k: v for k, v in new.items() if old.get(k) != v}
    patch.update({k: None for k in old if k not in new})
    return patch


def condition(status: Mapping[str, Any], ctype: str) -> Mapping[str, Any]:
    """One condition of a status, {} when absent."""
    for c in status.get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return {}
