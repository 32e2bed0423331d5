"""The current deployment of a `layout: auto` spec, as the switching loop prices it (pure).

An `auto` spec has no explicit layout to price: what serves is what the operator's
reconcile pass placed with the auto planner (`planner.auto`, or the simple fallback),
written to ``status.plan`` (`plan.Plan.to_status`: ``source`` ``auto:planner`` or
``auto:simple``, ``replicas`` with per-stage agent, device, layers and tp). `placed_replicas`
turns that plan back into explicit `spec.layout.replicas` (CRD form), `layout_spec` into the
parsed `api.LayoutSpec` the candidate source prices, and `current_of` names the candidate
that is that placement (replica names ignored: the planner's ``r<k>`` and the plan's names
need not agree, the blocks they describe do). A plan written for an explicit spec
(``source: explicit``, e.g. just after the spec was turned to `auto`) is not an auto
placement: None, and the loop waits for the reconcile pass. Callers: the operator's
switching loop (`tessera.control.switching.step`, `planner_candidates`) and
`policies.switching_candidates.build`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tessera import api

AUTO = "auto"  # the candidate name of the auto planner's placement


def placed_replicas(status_plan: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """``status.plan`` of an auto placement as explicit replicas (None: no auto plan, or
    a plan document that does not have the fields `Plan.to_status` writes)."""
    if not status_plan or not str(status_plan.get("source", "")).startswith("auto"):
        return None
    out: list[dict[str, Any]] = []
    try:
        for r in status_plan.get("replicas") or []:
            stages: list[dict[str, Any]] = []
            for s in r["stages"]:
                start, end = (int(x) for x in s["layers"])
                stage: dict[str, Any] = {
                    "agent": str(s["agent"]),
                    "device": str(s["device"]),
                    "layers": [start, end],
                }
                tp = int(s.get("tp", 1))
                if tp > 1:
                    stage["tp"] = tp
                if s.get("ranks"):
                    stage["ranks"] = [
                        {"agent": str(k["agent"]), "device": str(k["device"])} for k in s["ranks"]
                    ]
                stages.append(stage)
            if not stages:
                return None
            out.append({"name": str(r["name"]), "stages": stages})
    except (KeyError, TypeError, ValueError):
        return None
    return out or None


def layout_spec(replicas: Sequence[Mapping[str, Any]]) -> api.LayoutSpec:
    """Explicit replicas (CRD form, as `placed_replicas` writes them) parsed."""
    return api.LayoutSpec(
        "explicit",
        tuple(
            api.ReplicaSpec(
                str(r["name"]),
                tuple(
                    api.StageSpec(
                        str(s["agent"]),
                        str(s["device"]),
                        (int(s["layers"][0]), int(s["layers"][1])),
                        int(s.get("tp", 1)),
                        tuple(api.RankSpec(k["agent"], k["device"]) for k in s.get("ranks", ())),
                    )
                    for s in r["stages"]
                ),
            )
            for r in replicas
        ),
    )


def _blocks(replicas: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """A placement without replica names: each replica's stages with every rank placed."""
    out = []
    for r in layout_spec(replicas).replicas:
        out.append(
            tuple(
                (s.layers, s.tp, tuple((k.agent, k.device) for k in s.placements()))
                for s in r.stages
            )
        )
    return sorted(out)


def current_of(
    placed: Sequence[Mapping[str, Any]], layouts: Iterable[tuple[str, Sequence[Mapping[str, Any]]]]
) -> str | None:
    """The first candidate (name, replicas) placed as ``placed`` is (None: none)."""
    want = _blocks(placed)
    for name, replicas in layouts:
        try:
            if _blocks(replicas) == want:
                return name
        except (KeyError, TypeError, ValueError, IndexError):
            continue
    return None
