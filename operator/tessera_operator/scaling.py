"""Module scaling in the ServingDeployment's status and events (issue 15).

`status_doc` lists the deployment's replicated and migrated layer runs and where each
holder is, for `status.scaling.layerRuns` (called by `status.build`); `changes` names what
changed between two passes, which `reconciler` posts as events once each (`posted`:
LayerRunReplicated, LayerRunMigrated, LayerRunEvicted). Pure. (An agent's
`Describe.scaling_runs` become `observed.LayerRun`s in
`tessera.control.agents.runs_from_describe`.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import Any

from tessera import observed
from tessera_operator import announced


def status_doc(obs: observed.Observed | None, replicas: Set[str]) -> list[dict[str, Any]]:
    """`status.scaling.layerRuns`: the runs of these replicas (the deployment's plan)."""
    if obs is None:
        return []
    out = []
    for a in obs.agents:
        for r in a.layer_runs:
            if r.replica_id not in replicas:
                continue
            out.append(
                {
                    "replica": r.replica_id,
                    "stage": r.stage_index,
                    "layers": [r.start, r.end],
                    "agent": a.name,
                    "migrated": r.migrated,
                    "home": next((h.name for h in r.holders if h.home), ""),
                    "replicas": [h.name for h in r.holders if not h.home],
                }
            )
    return sorted(out, key=lambda d: (d["replica"], d["stage"], d["layers"]))


def changes(
    old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str]]:
    """(event reason, message) for every replica added, evicted or home moved."""

    def key(d: Mapping[str, Any]) -> tuple[str, int, int, int]:
        return (str(d["replica"]), int(d["stage"]), *map(int, d["layers"]))  # type: ignore[return-value]

    before, after = {key(d): d for d in old}, {key(d): d for d in new}
    out: list[tuple[str, str]] = []
    for k in sorted(set(before) | set(after)):
        b, a = before.get(k, {}), after.get(k, {})
        where = f"{k[0]} stage {k[1]} layers [{k[2]}, {k[3]})"
        for h in sorted(set(a.get("replicas", [])) - set(b.get("replicas", []))):
            out.append(("LayerRunReplicated", f"{where} replicated onto {h}"))
        for h in sorted(set(b.get("replicas", [])) - set(a.get("replicas", []))):
            out.append(("LayerRunEvicted", f"{where}: replica on {h} evicted"))
        if a and b and a.get("home") != b.get("home"):
            out.append(("LayerRunMigrated", f"{where} migrated {b.get('home')} -> {a.get('home')}"))
        elif a and not b and a.get("migrated"):
            out.append(("LayerRunMigrated", f"{where} migrated to {a.get('home')}"))
    return out


def posted() -> announced.Announced:
    """The operator's record of the layer runs its events announced (`announced.py`)."""
    return announced.Announced(changes, "layerRuns")
