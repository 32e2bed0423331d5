"""The ServingDeployment status from one reconcile pass: conditions, phase, plan, transition.

Pure; called by `reconciler.py`, which writes it last as a merge patch of what changed
(`merge_patch`: a converged pass writes nothing). Conditions: `Ready` (a complete generation
serves, also during or stalled in a transition), `Progressing` (a transition runs: Switching or
Loading, message the generation and step), `Degraded` (an agent unreachable or an action failed
after a plan exists), `PlanValid`; and kstatus's `Reconciling` (work under way) and `Stalled`
(the pass cannot proceed, with why), never both True. `status.transition` (generation, mode,
steps left, next step) is present while a transition has steps left; `status.plan.generation`
is the routes version. `lastTransitionTime` changes only when a condition's status flips.
Details in docs/operator.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tessera.control import outcome
from tessera.policies.security import admission
from tessera_operator import overload_status, replica_status, scaling

CONDITIONS = ("Ready", "Progressing", "Degraded", "PlanValid", "Reconciling", "Stalled")
WORKING = ("Loading", "Switching")  # work under way
STALLED = (
    "InvalidSpec",
    "InsufficientCapacity",
    "InsufficientMemory",
    "NoSource",
    "AgentUnreachable",
    "LoadFailed",
    *admission.REASONS,  # the operator's configuration refuses what the spec asks
)
PHASES = {
    "Serving": "Ready",
    "Loading": "Progressing",
    "Switching": "Progressing",
    "InvalidSpec": "Invalid",
    **{reason: "Invalid" for reason in admission.REASONS},
    "InsufficientCapacity": "Pending",
    "InsufficientMemory": "Pending",
    "NoSource": "Pending",
    "AgentUnreachable": "Degraded",
    "LoadFailed": "Degraded",
}


def _wanted(out: outcome.Outcome) -> dict[str, tuple[bool, str, str]]:
    """type -> (status, reason, message) for this pass."""
    reason, msg = out.reason, out.message
    serving = out.whole or (reason == "Serving" and out.routes is None)
    degraded = reason in ("AgentUnreachable", "LoadFailed") or (
        reason in ("InsufficientCapacity", "InsufficientMemory", "NoSource")
        and out.plan is not None
    )
    planned = out.plan is not None
    plan_msg = (
        f"{len(out.plan.replicas)} replicas ({out.plan.source}, generation "
        f"{out.plan.generation})" + (f": {out.plan.message}" if out.plan.message else "")
        if out.plan is not None
        else msg
    )
    if serving and reason != "Serving":
        ready_msg = f"serving: {', '.join(out.serving)}; {reason}: {msg}"
    else:
        ready_msg = msg
    stalled = reason in STALLED
    return {
        "Ready": (serving, "Serving" if serving else reason, ready_msg),
        "Progressing": (reason in WORKING, reason, msg),
        "Degraded": (degraded, reason if degraded else "AsExpected", msg if degraded else ""),
        "PlanValid": (planned, "Planned" if planned else reason, plan_msg),
        "Reconciling": (reason in WORKING, reason, msg if reason in WORKING else ""),
        "Stalled": (stalled, reason if stalled else "AsExpected", msg if stalled else ""),
    }


def transition_status(out: outcome.Outcome) -> dict[str, Any] | None:
    """`status.transition` while steps are left, else None."""
    t = out.remaining
    if t is None or not t.steps:
        return None
    step = t.steps[0]
    doc: dict[str, Any] = {
        "generation": t.generation,
        "mode": t.mode,
        "stepsLeft": len(t.steps),
        "step": step.action.describe(),
        "action": step.action.kind,
    }
    if t.blocked is not None:
        doc["blockedReason"] = t.blocked.reason
    if out.routes is not None:
        doc["routesVersion"] = out.routes.version
    return doc


def conditions(
    out: outcome.Outcome,
    generation: int,
    previous: Sequence[Mapping[str, Any]],
    now: str,
) -> list[dict[str, Any]]:
    """The conditions, keeping each one's lastTransitionTime unless its status flips."""
    before = {c.get("type"): c for c in previous}
    result = []
    wanted = _wanted(out)
    dropped = overload_status.groups(out)
    if dropped or "Overloaded" in before:  # issue 13: shown once a drop was seen
        wanted["Overloaded"] = overload_status.condition(dropped)
    for ctype, (ok, reason, message) in wanted.items():
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
    out: outcome.Outcome,
    generation: int,
    previous: Mapping[str, Any],
    now: str,
    endpoint: str,
) -> dict[str, Any]:
    """The full status after a pass. Without a plan (invalid spec, no capacity) the last
    plan and replica counts stay: the blocks it loaded keep serving."""
    status: dict[str, Any] = {
        key: previous[key]
        for key in (
            "plan",
            "replicas",
            "readyReplicas",
            "lastPlanTime",
            "endpoint",
            "switching",
            "autoscaling",  # the autoscale loop writes it (autoscale_tick.py)
        )
        if key in previous
    }
    if out.plan is not None:
        plan_doc: dict[str, Any] = {
            "source": out.plan.source,
            "generation": out.plan.generation,
            "replicas": out.plan.to_status(),
        }
        if out.plan.message:
            plan_doc["message"] = out.plan.message
        if previous.get("plan") != plan_doc or "lastPlanTime" not in previous:
            status["lastPlanTime"] = now
        status["plan"] = plan_doc
        status["replicas"] = len(out.plan.replicas)
        status["readyReplicas"] = len(out.ready_replicas)
        status["endpoint"] = endpoint
    mine = {r.replica_id for r in out.plan.replicas} if out.plan is not None else set()
    runs = scaling.status_doc(out.observed, mine)
    if runs:
        status["scaling"] = {"layerRuns": runs}
    moving = transition_status(out)
    if moving is not None:
        status["transition"] = moving
    loaded = replica_status.sources(out)  # issue 32: bytes by source, time to ready
    if loaded:
        status["replicaSources"] = loaded
    elif out.plan is None and "replicaSources" in previous:  # no plan: the blocks stay
        status["replicaSources"] = previous["replicaSources"]
    if out.variants:  # issue 14: each variant loaded where, ready or why not
        status["variants"] = [v.to_json() for v in out.variants]
    dropped = overload_status.groups(out)
    if dropped:
        status["overload"] = {"groups": dropped}
    status["observedGeneration"] = generation
    phase = PHASES.get(out.reason, "Pending")
    if out.whole and out.reason in STALLED and PHASES.get(out.reason) != "Invalid":
        phase = "Degraded"  # the old layout keeps serving
    status["phase"] = phase
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
