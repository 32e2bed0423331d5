"""The switching loop's timer: schedules `tessera.control.switching.step`, writes what it reports.

Registered by `handlers.build_registry` (`register`): every `cfg.switching_tick_seconds` per
ServingDeployment, stepping when `spec.policies.switching.enabled` and `spanSeconds` have
passed since the last step (kopf memo; turned off, `status.switching` is cleared). It gives the
step where to read: arrivals from the gateway Service (`GET /admin/v1/arrivals`, or
`cfg.switching_arrivals_url`) and candidates (`cfg.switching_candidates`, else
`default_candidates`: the planner's over the discovered agents, cached in
`reconciler.Context.candidates`). It writes `status.switching`, an event per recommendation or
switch, and in active mode a merge patch of `spec.layout` (explicit replicas), applied by the
update handler as a make-before-break transition; none while `status.transition` runs. Switching
an `auto` spec hands `spec.layout` to the loop until `layout: auto` is set again. Advisory mode
writes the recommendation only. No pass lock: it acts on no agent (docs/switching.md).
"""

from __future__ import annotations

import copy
import datetime
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kopf

from tessera import api, fields
from tessera.control import converge, switching
from tessera.observability import control
from tessera.policies.switching import candidates as switching_candidates
from tessera.policies.switching import decide as switching_decide
from tessera_operator import config, discovery, gateway_objects, kube, reconciler, timers

ARRIVALS_PATH = switching.ARRIVALS_PATH
DUE_KEY = "switching_due"


SwitchingCandidates = switching_decide.SwitchingCandidates
Outcome = switching_decide.Outcome
decide = switching_decide.decide
fetch_arrivals = switching.fetch_arrivals
CandidatesFn = Callable[[api.ServingDeployment, Sequence[str]], SwitchingCandidates | None]


def register(
    registry: kopf.OperatorRegistry, cfg: config.OperatorConfig, resource: tuple[str, str, str]
) -> None:
    """Add the loop's timer to `registry` (called by `handlers.build_registry`)."""
    timers.register_timer(
        registry, resource, "switching_tick", cfg.switching_tick_seconds, tick, cfg
    )


async def default_candidates(
    cfg: config.OperatorConfig,
    client: kube.Kube | None,
    dep: api.ServingDeployment,
    names: Sequence[str],
    placed: Sequence[Mapping[str, Any]] | None = None,
    cache: switching_candidates.CandidateCache | None = None,
) -> SwitchingCandidates:
    """The planner's candidates over the agents this operator discovers (module
    docstring); ValueError saying why there are none."""
    if client is not None:
        refs = await discovery.agent_refs(cfg, client, dep.spec.resources.node_selector)
    elif cfg.agents:
        refs = list(cfg.agents)
    else:
        raise ValueError("no Kubernetes client to discover the agents")
    return await switching.planner_candidates(
        dep,
        converge.resolve_model_path(dep.spec, None, cfg.model_root),
        refs,
        names,
        cfg.switching_profile,
        placed,
        cache if cache is not None else switching_candidates.CandidateCache(),
        cfg.switching_max_candidates,
        cfg.switching_calibration,
        tls=cfg.tls,
    )


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def arrivals_url(cfg: config.OperatorConfig, dep: api.ServingDeployment) -> str:
    if cfg.switching_arrivals_url:
        return cfg.switching_arrivals_url.format(namespace=dep.namespace, name=dep.name)
    return gateway_objects.endpoint(dep) + ARRIVALS_PATH


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

    async def arrivals() -> dict[str, Any]:
        return await switching.fetch_arrivals(
            arrivals_url(cfg, dep), cfg.gateway_admin_token, reconciler.admin_session(memo)
        )

    async def candidates(
        names: Sequence[str], placed: switching.Placed
    ) -> SwitchingCandidates | None:
        if cfg.switching_candidates is not None:
            made: SwitchingCandidates | None = cfg.switching_candidates(dep, names)
            return made
        ctx = memo.get("ctx")
        kube_client, cache = getattr(ctx, "kube", None), getattr(ctx, "candidates", None)
        return await default_candidates(cfg, kube_client, dep, names, placed, cache)

    out = await switching.step(
        dep, raw.get("spec") or {}, dict(body.get("status") or {}), arrivals, candidates, _now()
    )
    patch.status["switching"] = out.status
    if out.event is not None:
        kopf.info(body, reason=out.event[0], message=out.event[1])
    if out.layout is not None:
        patch["spec"] = {"layout": out.layout}
        control.current().note("switching", "switch", str(out.event or ""), deployment=dep.name)
