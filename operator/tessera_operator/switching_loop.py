"""The predictive switching loop's driver: one `switching_step.step` per span per deployment.

Registered by `handlers.build_registry` (`register`): a kopf timer every
`cfg.switching_tick_seconds` per ServingDeployment; a tick does nothing unless
`spec.policies.switching.enabled` and `spanSeconds` have passed since the last step
(kept in kopf's per-object memo). A step:

1. reads the gateway's per-class arrivals per span (`GET /admin/v1/arrivals` of the
   deployment's gateway Service, or `cfg.switching_arrivals_url` formatted with
   `namespace` and `name`);
2. asks `cfg.switching_candidates(dep, classes)` for the candidate deployments (explicit
   layouts, CRD form), their pricing at a per-class demand and the switch time between
   two of them (`SwitchingCandidates`); without one, `default_candidates` builds them from
   the planner (`tessera.policies.switching_candidates`: the model's config, the agents
   as observed, the cost profile `layout: auto` would use or `cfg.switching_profile`,
   the latency objective; planner candidates cached across spans in `CANDIDATE_CACHE`,
   at most `cfg.switching_max_candidates`); the current deployment is the candidate whose
   layout equals the spec's, or for a `layout: auto` spec the one placed as the auto
   planner's plan in `status.plan` is (`tessera.policies.switching_current`);
3. runs the pure step (`tessera.policies.switching_step`): forecast with the method best
   on the recent window, cheapest candidate at the forecast, gain vs switch cost,
   hysteresis (carried in `status.switching.hysteresis`);
4. writes `status.switching` (own key; the reconciler keeps it) and, on a recommendation
   or a switch, an event. **Advisory** mode changes nothing else (the recommended layout
   is in `status.switching.recommended`). **Active** mode applies the new layout through
   the existing transition path: it merge-patches `spec.layout` with the candidate's
   explicit replicas (as an HPA writes its target's `spec.replicas`), and the update
   handler's reconcile pass runs the make-before-break transition. No step switches
   while a transition is still running (`status.transition`). Switching an `auto` spec
   writes an explicit layout: from then on the loop owns `spec.layout` (as an HPA owns
   `spec.replicas`); `status.switching.specLayout` and `lastSwitch.layoutWas` say so, and
   setting `layout: auto` again hands the placement back to the auto planner.

Anything that goes wrong (gateway unreachable, no candidates, a bad price) becomes
`status.switching.reason`/`message` and the loop carries on next span.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf

from tessera import api, fields
from tessera.observability import control
from tessera.policies import (
    switching,
    switching_candidates,
    switching_current,
    switching_step,
)
from tessera_operator import agents, config, converge, discovery, gateway_objects, kube

ARRIVALS_PATH = "/admin/v1/arrivals"
DUE_KEY = "switching_due"
FETCH_TIMEOUT_S = 5.0
# planner candidates per planning problem, shared by every deployment this operator runs
CANDIDATE_CACHE = switching_candidates.CandidateCache()


@dataclass(frozen=True)
class SwitchingCandidates:
    """What the loop may switch between, and how it prices them."""

    layouts: Mapping[str, Sequence[Mapping[str, Any]]]  # name -> explicit layout replicas
    price: switching_step.Price  # (name, demand req/s in the arrivals' class order) -> P99 s
    switch_seconds: switching_step.SwitchSeconds  # (from, to) -> seconds


CandidatesFn = Callable[[api.ServingDeployment, Sequence[str]], SwitchingCandidates | None]


def register(
    registry: kopf.OperatorRegistry, cfg: config.OperatorConfig, resource: tuple[str, str, str]
) -> None:
    """Add the loop's timer to `registry` (called by `handlers.build_registry`)."""

    @kopf.timer(
        *resource,
        interval=cfg.switching_tick_seconds,
        initial_delay=cfg.switching_tick_seconds,
        registry=registry,
    )
    async def switching_tick(
        body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **kw: Any
    ) -> None:
        if not kw["stopped"] and not body.metadata.get("deletionTimestamp"):
            await tick(body, patch, memo, cfg)


async def default_candidates(
    cfg: config.OperatorConfig,
    client: kube.Kube | None,
    dep: api.ServingDeployment,
    names: Sequence[str],
    placed: Sequence[Mapping[str, Any]] | None = None,
) -> SwitchingCandidates:
    """Planner candidates from the model's config and the agents as observed (module
    docstring); ValueError saying why there are none."""
    if client is not None:
        refs = await discovery.agent_refs(cfg, client, dep.spec.resources.node_selector)
    elif cfg.agents:
        refs = list(cfg.agents)
    else:
        raise ValueError("no Kubernetes client to discover the agents")
    model_path = converge.resolve_model_path(dep.spec, None, cfg.model_root)
    shape = converge.model_facts(model_path, dep.spec.model.dtype)
    if shape is None:
        raise ValueError(f"model not readable: no config.json in {model_path}")
    obs = await agents.observe(refs)
    made = await asyncio.to_thread(
        switching_candidates.build,
        dep,
        shape,
        obs,
        names,
        cfg.switching_profile,
        placed=placed,
        cache=CANDIDATE_CACHE,
        max_candidates=cfg.switching_max_candidates,
    )
    return SwitchingCandidates(made.layouts, made.planned.price, made.planned.switch_seconds)


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def fetch_arrivals(url: str) -> dict[str, Any]:
    """The gateway's arrivals snapshot; ValueError saying why it could not be read."""
    try:
        timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as s, s.get(url) as r:
            if r.status != 200:
                raise ValueError(f"GET {url}: HTTP {r.status}")
            doc = await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        raise ValueError(f"GET {url}: {exc!r}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("spans"), list):
        raise ValueError(f"GET {url}: not an arrivals document")
    return doc


def arrivals_url(cfg: config.OperatorConfig, dep: api.ServingDeployment) -> str:
    if cfg.switching_arrivals_url:
        return cfg.switching_arrivals_url.format(namespace=dep.namespace, name=dep.name)
    return gateway_objects.endpoint(dep) + ARRIVALS_PATH


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


def _held(previous: Mapping[str, Any]) -> dict[str, Any]:
    """The hysteresis carried over a span with no step."""
    return {"hysteresis": previous["hysteresis"]} if "hysteresis" in previous else {}


def _stopped(base: dict[str, Any], reason: str, message: str) -> Outcome:
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
        return _stopped(base, "WaitingForArrivals", "the gateway has no complete span yet")
    if candidates is None or not candidates.layouts:
        return _stopped(base, "NoCandidates", "no candidate deployments to price")
    auto = dep.spec.layout.mode == "auto"
    if auto and placed is None:
        return _stopped(
            base, "CurrentNotACandidate", "layout auto: no auto placement in status.plan yet"
        )
    if auto:
        assert placed is not None
        current = switching_current.current_of(placed, candidates.layouts.items())
    else:
        current = current_name(raw_spec, dep, candidates.layouts)
    if current is None:
        what = "the auto planner's placement" if auto else "the spec's layout"
        return _stopped(base, "CurrentNotACandidate", f"{what} is none of the candidate layouts")
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
        )
    except ValueError as exc:
        return _stopped(base, "StepFailed", str(exc))
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


async def tick(
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    cfg: config.OperatorConfig,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """A timer tick: a step when switching is enabled and a span has passed."""
    raw = copy.deepcopy(dict(body))
    try:
        dep = api.parse(raw)
    except fields.FieldError:
        return  # the reconciler reports the invalid spec
    sw = dep.spec.policies.switching
    if not sw.enabled:
        memo.pop(DUE_KEY, None)
        if (body.get("status") or {}).get("switching") is not None:
            patch.status["switching"] = None  # turned off: no stale recommendation
        return
    now = clock()
    due = memo.get(DUE_KEY)
    if due is not None and now < due:
        return
    memo[DUE_KEY] = now + sw.span_seconds
    status = dict(body.get("status") or {})
    previous = dict(status.get("switching") or {})
    base = {
        "mode": sw.mode,
        "spanSeconds": sw.span_seconds,
        "lastStepTime": _now(),
        "specLayout": dep.spec.layout.mode,
    }
    placed = (
        switching_current.placed_replicas(status.get("plan"))
        if dep.spec.layout.mode == "auto"
        else None
    )
    try:
        snapshot = await fetch_arrivals(arrivals_url(cfg, dep))
    except ValueError as exc:
        out = _stopped(base | _held(previous), "ArrivalsUnavailable", str(exc))
    else:
        names = [str(n) for n in snapshot.get("classes") or []]
        try:
            if cfg.switching_candidates is not None:
                made = cfg.switching_candidates(dep, names)
            elif snapshot.get("spans"):
                ctx = memo.get("ctx")
                made = await default_candidates(cfg, getattr(ctx, "kube", None), dep, names, placed)
            else:
                made = None  # decide says WaitingForArrivals
        except ValueError as exc:
            out = _stopped(base | _held(previous), "NoCandidates", str(exc))
        else:
            # pricing every candidate can take seconds (the planner's latency model):
            # off the event loop, as building them is
            out = await asyncio.to_thread(
                decide,
                dep,
                raw.get("spec") or {},
                previous,
                "transition" in status,
                snapshot,
                made,
                _now(),
                placed,
            )
    patch.status["switching"] = out.status
    if out.event is not None:
        kopf.info(body, reason=out.event[0], message=out.event[1])
    if out.layout is not None:
        patch["spec"] = {"layout": out.layout}
        control.current().note("switching", "switch", str(out.event or ""), deployment=dep.name)
