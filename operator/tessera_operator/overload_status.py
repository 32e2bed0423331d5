"""Overload drops as the operator reports them (issue 13): status, condition and events.

Called by `status.build` (the `status.overload` document and the `Overloaded` condition)
and by `reconciler._pass` (events when a group appears or goes). Input: a pass's
`converge.Outcome` (the plan and what the agents hold). A *dropped group* is a replica
the plan has whole that the agents hold as a pipeline: the overload loop
(`tessera.control.overload_loop`) turned it and donor replicas into one (`docs/overload.md`).
Each group lists its stages: agent, layers, KV pages. Pure, except `record`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import kopf

from tessera.control import converge

REASON_DROPPED = "LayersDropped"
REASON_WHOLE = "WholeReplicas"


def groups(out: converge.Outcome) -> list[dict[str, Any]]:
    """Dropped groups: planned whole replicas held as pipelines, with each stage's layers
    and KV pages, sorted by head replica."""
    if out.plan is None or out.observed is None:
        return []
    whole = {r.replica_id for r in out.plan.replicas if len(r.stages) == 1}
    stages: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for a in out.observed.agents:
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


def record(body: kopf.Body, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Post the events for `changes` between the previous and the new `status.overload`."""
    for reason, message in changes(old.get("groups") or [], new.get("groups") or []):
        kopf.info(body, reason=reason, message=message)
