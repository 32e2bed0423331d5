"""One step of the predictive switching loop, decided from what was read (issue 11).

Pure apart from the candidates' pricing callbacks. Input: the parsed deployment and its raw
spec, the previous `status.switching`, whether a transition runs, the gateway's arrivals
snapshot, the candidate deployments (`SwitchingCandidates`), the time, and for a
`layout: auto` spec the auto planner's placement. Output: an `Outcome`: the
`status.switching` document, an event, and for an active switch the `spec.layout` to
apply. Caller: `tessera.control.switching.step` (the loop that reads, and whose shell writes
what this returns); the decision itself is `policies.switching_step.step`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera import api, fields
from tessera.policies.switching import current as switching_current
from tessera.policies.switching import gain as switching
from tessera.policies.switching import step as switching_step


@dataclass(frozen=True)
class SwitchingCandidates:
    """What the loop may switch between, and how it prices them."""

    layouts: Mapping[str, Sequence[Mapping[str, Any]]]  # name -> explicit layout replicas
    price: switching_step.Price  # (name, demand req/s in the arrivals' class order) -> P99 s
    switch_seconds: switching_step.SwitchSeconds  # (from, to) -> seconds
    # the latency model's measured relative error per candidate (the hysteresis,
    # `switching.gain_threshold`); None: unknown, minGain applies
    model_error: Callable[[str], float | None] | None = None


def current_name(
    raw_spec: Mapping[str, Any], dep: api.ServingDeployment, layouts: Mapping[str, Any]
) -> str | None:
    """The candidate whose layout is the spec's (compared parsed, so defaults match)."""
    for name, replicas in layouts.items():
        doc = copy.deepcopy(dict(raw_spec))
        doc["layout"] = {**doc.get("layout", {}), "mode": "explicit", "replicas": list(replicas)}
        try:
            parsed = api.parse_spec(doc)
        except fields.FieldError:
            continue
        if parsed.layout.replicas == dep.spec.layout.replicas:
            return name
    return None


@dataclass(frozen=True)
class Outcome:
    """What one step writes: status.switching, an event, and the spec patch (active)."""

    status: dict[str, Any]
    event: tuple[str, str] | None = None  # (reason, message)
    layout: dict[str, Any] | None = None  # spec.layout to apply (active switch)


def held(previous: Mapping[str, Any]) -> dict[str, Any]:
    """The hysteresis carried over a span with no step."""
    return {"hysteresis": previous["hysteresis"]} if "hysteresis" in previous else {}


def stopped(base: dict[str, Any], reason: str, message: str) -> Outcome:
    return Outcome({**base, "reason": reason, "message": message})


def decide(
    dep: api.ServingDeployment,
    raw_spec: Mapping[str, Any],
    previous: Mapping[str, Any],
    transition_running: bool,
    snapshot: Mapping[str, Any],
    candidates: SwitchingCandidates | None,
    now: str,
    placed: Sequence[Mapping[str, Any]] | None = None,
) -> Outcome:
    """One step from what was read (pure apart from the candidate callbacks); ``placed``:
    the auto planner's placement of an `auto` spec (`switching_current.placed_replicas`)."""
    sw = dep.spec.policies.switching
    base: dict[str, Any] = {
        "mode": sw.mode,
        "spanSeconds": sw.span_seconds,
        "lastStepTime": now,
        "specLayout": dep.spec.layout.mode,
    }
    if "hysteresis" in previous:
        base["hysteresis"] = previous["hysteresis"]
    spans = snapshot.get("spans") or []
    if not spans:
        return stopped(base, "WaitingForArrivals", "the gateway has no complete span yet")
    if candidates is None or not candidates.layouts:
        return stopped(base, "NoCandidates", "no candidate deployments to price")
    auto = dep.spec.layout.mode == "auto"
    if auto and placed is None:
        return stopped(
            base, "CurrentNotACandidate", "layout auto: no auto placement in status.plan yet"
        )
    if auto:
        assert placed is not None
        current = switching_current.current_of(placed, candidates.layouts.items())
    else:
        current = current_name(raw_spec, dep, candidates.layouts)
    if current is None:
        what = "the auto planner's placement" if auto else "the spec's layout"
        return stopped(base, "CurrentNotACandidate", f"{what} is none of the candidate layouts")
    cfg = switching.config_from_spec(sw)
    state = switching_step.state_from_json(previous.get("hysteresis"))
    span_scale = float(snapshot.get("spanSeconds") or sw.span_seconds) / sw.span_seconds
    history = [[float(c) / span_scale for c in row] for row in spans]  # counts per spec span
    try:
        s = switching_step.step(
            cfg,
            state,
            history,
            current,
            list(candidates.layouts),
            candidates.price,
            candidates.switch_seconds,
            model_error=candidates.model_error,
        )
    except ValueError as exc:
        return stopped(base, "StepFailed", str(exc))
    doc = {**base, **s.to_json(), "classes": list(snapshot.get("classes") or [])}
    d = s.decision
    doc["reason"], doc["message"] = d.action.capitalize(), d.reason
    if d.action == switching.RECOMMEND:
        doc["recommended"] = {
            "name": d.candidate,
            "replicas": list(candidates.layouts[d.candidate]),
        }
        msg = f"{current} -> {d.candidate}: {d.reason}"
        return Outcome(doc, ("SwitchRecommended", msg))
    if d.action == switching.SWITCH:
        if transition_running:  # decided nothing: the hysteresis stays as it was
            doc = {k: v for k, v in doc.items() if k != "hysteresis"} | {
                k: v for k, v in base.items() if k == "hysteresis"
            }
            doc["reason"] = "TransitionRunning"
            doc["message"] = f"would switch to {d.candidate}; a transition is still running"
            return Outcome(doc)
        replicas = [copy.deepcopy(dict(r)) for r in candidates.layouts[d.candidate]]
        doc["lastSwitch"] = {
            "from": current,
            "to": d.candidate,
            "time": now,
            "layoutWas": dep.spec.layout.mode,
        }
        msg = f"{current} -> {d.candidate}: {d.reason}"
        if auto:
            msg += "; spec.layout auto -> explicit: the switching loop now owns spec.layout"
        return Outcome(doc, ("SwitchApplied", msg), {"mode": "explicit", "replicas": replicas})
    doc.pop("recommended", None)
    if "lastSwitch" in previous:
        doc["lastSwitch"] = previous["lastSwitch"]
    return Outcome(doc)
