"""Overload drops as the operator reports them (issue 13): status, condition and events.

Called by `status.build` (the `status.overload` document and the `Overloaded` condition),
by `reconciler.one_pass` (events when a group appears or goes) and by the overload
loop's tick after it acted (`patch`: the same two fields from the tick's new
observation, without a reconcile pass). Input: a pass's `outcome.Outcome`, or the
whole replicas `status.plan` names and an observation. A *dropped group* is a replica
the plan has whole that the agents hold as a pipeline: the overload loop
(`tessera.control.overload`) turned it and donor replicas into one (`docs/overload.md`).
Each group lists its stages: agent, layers, KV pages. Pure.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from tessera import observed
from tessera.control import outcome
from tessera_operator import announced

REASON_DROPPED = "LayersDropped"
REASON_WHOLE = "WholeReplicas"


def groups(out: outcome.Outcome) -> list[dict[str, Any]]:
    """Dropped groups: planned whole replicas held as pipelines, with each stage's layers
    and KV pages, sorted by head replica."""
    if out.plan is None or out.observed is None:
        return []
    return held_groups(
        {r.replica_id for r in out.plan.replicas if len(r.stages) == 1}, out.observed
    )


def held_groups(whole: Collection[str], obs: observed.Observed) -> list[dict[str, Any]]:
    """`groups` from the planned whole replicas' ids and an observation of the agents."""
    stages: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for a in obs.agents:
        for b in a.blocks:
            if b.replica_id in whole and b.num_stages > 1 and b.tp_rank == 0:
                stage = {"agent": a.name, "layers": [b.start, b.end], "kvPages": b.kv_pages}
                stages.setdefault(b.replica_id, []).append((b.stage_index, stage))
    return [
        {"head": rid, "stages": [s for _, s in sorted(found, key=lambda t: t[0])]}
        for rid, found in sorted(stages.items())
    ]


def describe(group: Mapping[str, Any]) -> str:
    parts = [
        f"{s['agent']} [{s['layers'][0]}, {s['layers'][1]}) {s['kvPages']} KV pages"
        for s in group["stages"]
    ]
    return f"{group['head']}: " + " | ".join(parts)


def condition(found: Sequence[Mapping[str, Any]]) -> tuple[bool, str, str]:
    """The `Overloaded` condition: True while any group is dropped."""
    if not found:
        return False, REASON_WHOLE, "every replica holds the whole model"
    return True, REASON_DROPPED, "; ".join(describe(g) for g in found)


def changes(
    old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str]]:
    """(reason, message) per group that appeared (`OverloadDropped`) or went
    (`OverloadRestored`) between two statuses."""
    before = {g["head"]: g for g in old}
    after = {g["head"]: g for g in new}
    out = [("OverloadDropped", describe(after[h])) for h in sorted(after) if h not in before]
    out += [
        ("OverloadRestored", f"{h}: whole-model replicas again")
        for h in sorted(before)
        if h not in after
    ]
    return out


def patch(
    previous: Mapping[str, Any], found: Sequence[Mapping[str, Any]], generation: int, now: str
) -> dict[str, Any]:
    """The status merge patch that makes `status.overload` and the `Overloaded` condition
    of `previous` (a status) say `found` (as `status.build` would), {} when they do.
    Other conditions are kept as they are; the condition keeps its lastTransitionTime
    unless its status flips."""
    out: dict[str, Any] = {}
    doc = {"groups": [dict(g) for g in found]} if found else None
    if previous.get("overload") != doc:
        out["overload"] = doc
    conds = [dict(c) for c in previous.get("conditions") or []]
    old = next((c for c in conds if c.get("type") == "Overloaded"), None)
    if not found and old is None:  # shown once a drop was seen (status.conditions)
        return out
    ok, reason, message = condition(found)
    status = "True" if ok else "False"
    if old is not None and (old.get("status"), old.get("reason"), old.get("message")) == (
        status,
        reason,
        message,
    ):
        return out
    since = old.get("lastTransitionTime") if old and old.get("status") == status else None
    new = {
        "type": "Overloaded",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or now,
        "observedGeneration": generation,
    }
    out["conditions"] = [new if c is old else c for c in conds] if old else [*conds, new]
    return out


def posted() -> announced.Announced:
    """The operator's record of the groups its events announced (`announced.py`)."""
    return announced.Announced(changes, "groups")
