"""What every kopf handler calls: one reconcile pass over a ServingDeployment, or its finalizer.

`run()` is level-triggered and idempotent (create, update, resume and the resync
timer all run the same pass): parse the spec, discover the agents, `converge.converge`
(semantic checks, observe, plan, diff, apply), create or replace the gateway's routes
ConfigMap, Deployment and Service, then write the status last, through kopf's patch, as
the difference from the current status (nothing when converged). Passes of one object
never overlap: a per-object `observation.Pass` (the pass lock, and the observation of the
agents its holder shares with the loops' ticks of one interval) lives in kopf's
per-object memo, and a timer pass that finds a pass running skips. `finalize()` unloads
the deployment's blocks from every agent before kopf removes the finalizer. Handlers
return None, so kopf stores no results.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from tessera import api, fields, plan, reconcile, routes_doc
from tessera.control import (
    actuate,
    agents,
    converge,
    gateway_load,
    link_probe,
    observation,
    outcome,
)
from tessera.policies.scaling import autoscale
from tessera.policies.security import admission
from tessera.policies.switching import candidates as switching_candidates
from tessera.policies.transition import planner as transition
from tessera_operator import (
    announced,
    config,
    discovery,
    events,
    gateway_certificate,
    gateway_objects,
    kube,
    overload_status,
    owned,
    replica_status,
    routes_publish,
    scaling,
    status,
)


@dataclass(frozen=True)
class Context:
    """Operator-wide state every handler reaches through kopf's memo (`memo["ctx"]`)."""

    config: config.OperatorConfig
    kube: kube.Kube
    # the agents' measured links, probed once per pair (issue 32; docs/scaling.md)
    probe: link_probe.LinkProbe = field(init=False)
    # planner candidates per planning problem, shared by every deployment (switching_loop)
    candidates: switching_candidates.CandidateCache = field(
        default_factory=switching_candidates.CandidateCache
    )
    # every deployment's kept admin session (`admin_session`), closed when the operator stops
    admin_sessions: list[gateway_load.AdminSession] = field(default_factory=list)
    # the overload groups and layer runs last announced per deployment (announced.py)
    posted: announced.Announced = field(default_factory=overload_status.posted)
    runs_posted: announced.Announced = field(default_factory=scaling.posted)

    def __post_init__(self) -> None:
        object.__setattr__(self, "probe", link_probe.LinkProbe(self.config.tls))


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def deployment_pass(memo: kopf.Memo) -> observation.Pass:
    """The deployment's `Pass`: its lock (reconcile passes and loop ticks never
    interleave) and the observation they share until an actuator acts or one overload
    tick's time has passed; the agents are asked over channels kept for the object."""
    held = memo.get("pass")
    if held is None:
        ctx = memo.get("ctx")
        fresh_s = ctx.config.overload_tick_seconds if isinstance(ctx, Context) else 0.0
        tls = ctx.config.tls if isinstance(ctx, Context) else None
        held = memo["pass"] = observation.Pass(
            observation.Observation([], channels=agents.Channels(tls), max_age_s=fresh_s, tls=tls)
        )
    assert isinstance(held, observation.Pass)
    return held


def admin_session(memo: kopf.Memo) -> gateway_load.AdminSession:
    """The deployment's kept HTTP session to its gateway's admin API (the loops' reads and
    routes pushes: one connection, not one per tick), closed with its agent channels."""
    held = memo.get("admin_session")
    if held is None:
        held = memo["admin_session"] = gateway_load.AdminSession()
        ctx = memo.get("ctx")
        if isinstance(ctx, Context):
            ctx.admin_sessions.append(held)
    assert isinstance(held, gateway_load.AdminSession)
    return held


async def close_admin_session(memo: kopf.Memo) -> None:
    """Close the deployment's kept admin session, if it has one, and forget it (deletion)."""
    held = memo.pop("admin_session", None)
    if isinstance(held, gateway_load.AdminSession):
        ctx = memo.get("ctx")
        if isinstance(ctx, Context) and held in ctx.admin_sessions:
            ctx.admin_sessions.remove(held)
        await held.close()


def lock(memo: kopf.Memo) -> asyncio.Lock:
    """The deployment's pass lock (`deployment_pass`)."""
    return deployment_pass(memo).lock


def context(memo: kopf.Memo) -> Context:
    ctx = memo["ctx"]
    assert isinstance(ctx, Context)
    return ctx


async def run(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, periodic: bool = False) -> None:
    """One pass; `periodic` passes (the resync timer) skip when another pass is running."""
    if body.metadata.get("deletionTimestamp"):
        return  # the finalizer owns the object now
    held = deployment_pass(memo)
    if periodic and held.lock.locked():
        return
    async with held.held(keep=True) as seen:
        await one_pass(body, patch, context(memo), seen)


def _rollout(ctx: Context) -> converge.Rollout:
    cfg = ctx.config
    return converge.Rollout(
        drain=transition.DrainPolicy(
            cfg.drain_deadline_seconds, cfg.drain_grace_seconds, cfg.drain_settle_seconds
        ),
        probe=ctx.probe,
    )


def _routes_writer(
    ctx: Context, body: kopf.Body, dep: api.ServingDeployment, owner: dict[str, Any]
) -> outcome.Publish:
    """The cut-over of a transition: write the routes ConfigMap now and push it to the
    gateway (`routes_publish`)."""

    async def publish(doc: routes_doc.RoutesDoc, _plan: plan.Plan) -> None:
        written = await routes_publish.write(ctx.kube, ctx.config, dep, owner, doc)
        events.applied(body, written.applied)

    return publish


async def _apply_gateway(
    ctx: Context,
    body: kopf.Body,
    dep: api.ServingDeployment,
    owner: dict[str, Any],
    out: outcome.Outcome,
    model_path: str,
    routes_cm: dict[str, Any] | None,
) -> None:
    """The routes ConfigMap (`routes_cm`: as read at the pass's start, None when a
    cut-over rewrote it since), the gateway Deployment and Service."""
    tmpl = ctx.config.gateway
    doc = out.routes or routes_doc.RoutesDoc(())  # nothing routed yet
    full = converge.filled(dep, out.plan, model_path, doc)
    written = await routes_publish.write(ctx.kube, ctx.config, dep, owner, full, routes_cm)
    events.applied(body, written.applied)
    cert = gateway_certificate.certificate(dep, owner, tmpl)
    if cert is not None:  # before the Deployment that mounts its Secret
        events.applied(body, await owned.apply(ctx.kube, cert))
    for obj in (
        gateway_objects.deployment(dep, owner, tmpl, model_path, ctx.config.model_root),
        gateway_objects.service(dep, owner, tmpl),
    ):
        events.applied(body, await owned.apply(ctx.kube, obj))


async def _routes_config_map(ctx: Context, dep: api.ServingDeployment) -> dict[str, Any] | None:
    """The routes ConfigMap as stored (level-triggered: read back every pass)."""
    return await routes_publish.stored(ctx.kube, dep)


async def _serve(
    ctx: Context, body: kopf.Body, raw: dict[str, Any], seen: observation.Observation | None
) -> tuple[outcome.Outcome, str]:
    """One pass's outcome, and the gateway endpoint ("" while nothing is planned)."""
    try:
        dep = api.parse(raw)
    except fields.FieldError as exc:
        return outcome.Outcome("InvalidSpec", str(exc), errors=[exc]), ""
    model_path = converge.resolve_model_path(dep.spec, None, ctx.config.model_root)
    verdict = admission.admit(dep.spec, model_path, ctx.config.admission)
    if not verdict.allowed:  # nothing is planned, loaded or created for a refused spec
        return outcome.Outcome(verdict.reason, verdict.message), ""
    refs = await discovery.agent_refs(ctx.config, ctx.kube, dep.spec.resources.node_selector)
    owner = gateway_objects.owner_reference(raw)
    routes_cm = await _routes_config_map(ctx, dep)
    published = gateway_objects.published(routes_cm)
    if seen is not None:
        seen.retarget(refs)
    out = await converge.converge(
        dep,
        model_path,
        refs,
        progress=functools.partial(events.action, body),
        published=published,
        publish=_routes_writer(ctx, body, dep, owner),
        rollout=_rollout(ctx),
        tls=ctx.config.tls,
        replicas_cap=autoscale.plan_cap(
            dep.spec.scaling.enabled,
            dep.spec.layout.mode,
            (raw.get("status") or {}).get("autoscaling"),
            dep.spec.scaling.config().max_replicas,
        ),
        shared=seen,
    )
    if out.plan is None:
        return out, ""
    unchanged = routes_cm if out.routes is published else None
    await _apply_gateway(ctx, body, dep, owner, out, model_path, unchanged)
    return out, gateway_objects.endpoint(dep)


async def one_pass(
    body: kopf.Body,
    patch: kopf.Patch,
    ctx: Context,
    seen: observation.Observation | None = None,
    autoscaling: Mapping[str, Any] | None = None,
) -> None:
    """One pass; the caller holds the pass lock, `seen` its observation (a loop tick
    that changed the agents calls `seen.acted()` first). `autoscaling`: the
    `status.autoscaling` the autoscale tick is writing in the same patch (a new
    `desiredReplicas`), planned now instead of the one the body was read with."""
    raw = copy.deepcopy(dict(body))
    if autoscaling is not None:
        raw["status"] = {**(raw.get("status") or {}), "autoscaling": dict(autoscaling)}
    generation = int(body.metadata.get("generation") or 0)
    previous: dict[str, Any] = copy.deepcopy(dict(body.get("status") or {}))
    out, endpoint = await _serve(ctx, body, raw, seen)
    new = status.build(out, generation, previous, _now(), endpoint)
    events.transition(body, status.condition(previous, "Ready"), status.condition(new, "Ready"))
    events.switching(
        body, status.condition(previous, "Progressing"), status.condition(new, "Progressing")
    )
    ctx.runs_posted.record(body, previous.get("scaling") or {}, new.get("scaling") or {})
    replica_status.ready_events(
        body, previous.get("replicaSources") or [], new.get("replicaSources") or []
    )
    ctx.posted.record(body, previous.get("overload") or {}, new.get("overload") or {})
    for key, value in status.merge_patch(previous, new).items():
        patch.status[key] = value


async def finalize(body: kopf.Body, memo: kopf.Memo, retry: int) -> None:
    """Unload every block of the deployment; retry while agents are down, then give up
    (the blocks left on unreachable agents are reported as orphaned)."""
    ctx = context(memo)
    held = deployment_pass(memo)
    async with held.lock:
        meta = body.metadata
        prefix = plan.replica_prefix(meta.namespace or "default", meta.name or "")
        refs = await discovery.agent_refs(ctx.config, ctx.kube, {})
        obs = await agents.observe(refs, tls=ctx.config.tls)
        actions = reconcile.delete_actions(obs, prefix)
        results = await actuate.apply(
            actions, functools.partial(events.action, body), tls=ctx.config.tls
        )
        down = [a.name for a in obs.agents if not a.reachable]
        failed = [r.action.describe() for r in results if not r.ok]
        problems = [f"agent {n} unreachable" for n in down] + failed
        if problems and retry < ctx.config.finalizer_retries:
            raise kopf.TemporaryError("; ".join(problems), delay=2.0)
        message = f"unloaded {len(results) - len(failed)} blocks"
        if problems:
            message += "; may be left behind: " + "; ".join(problems)
        events.released(body, message, ok=not problems)
        held.observation.acted()
        if held.observation.channels is not None:
            await held.observation.channels.close()
        await close_admin_session(memo)
