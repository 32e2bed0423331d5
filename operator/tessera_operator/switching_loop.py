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
3. runs the pure step (`tessera.policies.switching_decide.decide` over
   `switching_step`): forecast with the method best
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
from typing import Any

import aiohttp
import kopf

from tessera import api, fields
from tessera.control import agents, converge
from tessera.observability import control
from tessera.policies import switching_candidates, switching_current, switching_decide
from tessera_operator import config, discovery, gateway_objects, kube

ARRIVALS_PATH = "/admin/v1/arrivals"
DUE_KEY = "switching_due"
FETCH_TIMEOUT_S = 5.0
# planner candidates per planning problem, shared by every deployment this operator runs
CANDIDATE_CACHE = switching_candidates.CandidateCache()


SwitchingCandidates = switching_decide.SwitchingCandidates
Outcome = switching_decide.Outcome
decide = switching_decide.decide
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


def _stop(base: dict[str, Any], previous: Mapping[str, Any], reason: str, message: str) -> Outcome:
    return switching_decide.stopped(base | switching_decide.held(previous), reason, message)


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
        out = switching_decide.stopped(
            base | switching_decide.held(previous), "ArrivalsUnavailable", str(exc)
        )
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
            out = switching_decide.stopped(
                base | switching_decide.held(previous), "NoCandidates", str(exc)
            )
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
