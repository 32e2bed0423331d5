"""The replica autoscaler on the cluster: a kopf timer that ticks `tessera.control.autoscale_loop`.

Registered by `handlers.build_registry` (`register`): every `cfg.autoscale_tick_seconds` (1 s)
per ServingDeployment, doing nothing unless `spec.scaling.enabled` and `status.plan` names
replicas. A tick reads the gateway's demand (`GET /admin/v1/load` and `/metrics`, or
`cfg.gateway_admin_url`), takes the deployment's pass (`reconciler.deployment_pass`; skips if
one runs, so a sleep never interleaves with a load) and runs one `AutoscaleLoop.tick` over the
pass's shared observation and kept channels, on each planned replica's leader. A new plan count
(`desiredReplicas`) runs a reconcile pass at once under the same lock; while that resize has
steps left, each tick runs the next pass. Events are posted (`ScaleFromZero`, `ReplicaWoke`,
`WakeFailed`, ...) and `status.autoscaling` written (docs/scaling.md). The loop lives in kopf's
per-object memo; a new operator starts from what the leaders report.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from tessera.control import autoscale_loop, gateway_demand, observation
from tessera.policies.scaling import autoscale
from tessera_operator import config, discovery, reconciler, routes_publish, timers

log = logging.getLogger(__name__)
LOOP_KEY = "autoscale_loop"
WARNED_KEY = "autoscale_demand_warned"
RESIZING_KEY = "autoscale_resizing"  # a resize's transition is still under way


def register(
    registry: kopf.OperatorRegistry, cfg: config.OperatorConfig, resource: tuple[str, str, str]
) -> None:
    """Add the loop's timer to `registry` (called by `handlers.build_registry`)."""
    timers.register_timer(
        registry, resource, "autoscale_tick", cfg.autoscale_tick_seconds, tick, cfg
    )


def leaders(plan_status: Mapping[str, Any] | None) -> dict[str, str]:
    """Replica id -> its stage 0's agent, for every replica `status.plan` names."""
    out = {}
    for r in (plan_status or {}).get("replicas") or []:
        stages = r.get("stages") or []
        if r.get("replicaId") and stages:
            out[str(r["replicaId"])] = str(stages[0].get("agent") or "")
    return out


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def tick(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, cfg: config.OperatorConfig
) -> None:
    """One tick (module docstring)."""
    dep = timers.deployment(body)
    if dep is None:
        return
    loop = memo.get(LOOP_KEY)
    if not dep.spec.scaling.enabled:
        if isinstance(loop, autoscale_loop.AutoscaleLoop):
            await loop.close()
            memo.pop(LOOP_KEY, None)
        return
    status = body.get("status") or {}
    by_agent = leaders(status.get("plan"))
    if not by_agent:
        return
    deployment = reconciler.deployment_pass(memo)
    if deployment.lock.locked():
        return
    async with deployment.held(keep=True) as seen:
        ctx = reconciler.context(memo)
        base = routes_publish.admin_url(cfg, dep)
        fetch = gateway_demand.fetch(base, cfg.gateway_admin_token, reconciler.admin_session(memo))
        demand = await timers.from_gateway(
            body, memo, WARNED_KEY, "GatewayDemandUnavailable", fetch
        )
        if demand is None:
            return
        refs = await discovery.agent_refs(cfg, ctx.kube, dep.spec.resources.node_selector)
        address = {r.name: r.address for r in refs}
        members = {rid: address[a] for rid, a in by_agent.items() if a in address}
        if not isinstance(loop, autoscale_loop.AutoscaleLoop):
            loop = memo[LOOP_KEY] = autoscale_loop.AutoscaleLoop(
                autoscale_loop.Leaders(seen.channels, tls=cfg.tls),
                deployment=f"{dep.namespace}/{dep.name}",
            )
        seen.retarget(refs)
        described = await seen.replies()  # the pass's observation, shared
        ttft_slo_s = dep.spec.slo.ttft_p99_ms / 1000.0
        previous = dict(status.get("autoscaling") or {})
        acfg = dep.spec.scaling.config(ttft_slo_s)
        resize = autoscale_loop.Resize(
            len(by_agent),
            autoscale.plan_cap(True, dep.spec.layout.mode, previous, acfg.max_replicas),
            dep.spec.layout.mode == "auto",
        )
        acted = True  # a tick that failed may have acted part-way
        try:
            out = await loop.tick(members, demand, acfg, resize, described)
            acted = out.acted
        finally:
            if acted:  # woke or slept a replica: the next `get` observes again
                seen.acted()
        new = _autoscaling(out, previous)
        if new is not None and new.get("desiredReplicas") != previous.get("desiredReplicas"):
            memo[RESIZING_KEY] = True
            await _resize_now(body, patch, ctx, seen, new, out)
        elif memo.get(RESIZING_KEY):  # the resize's transition, step by step (drains)
            moving = status.get("transition") or {}
            if moving and not moving.get("blockedReason"):
                await _resize_now(body, patch, ctx, seen, new or previous, out)
            elif not moving:
                memo.pop(RESIZING_KEY, None)
    for e in out.events:
        post = kopf.warn if e.kind == "Warning" else kopf.info
        post(body, reason=e.reason, message=e.message)
    if new is not None and new != previous:
        patch.status["autoscaling"] = new


async def _resize_now(
    body: kopf.Body,
    patch: kopf.Patch,
    ctx: reconciler.Context,
    seen: observation.Observation,
    new: Mapping[str, Any],
    out: autoscale_loop.Tick,
) -> None:
    """A new plan count is planned at once, by a reconcile pass under the lock this tick
    holds (not at the next resync); a failed pass is left to the resync."""
    try:
        await reconciler.one_pass(body, patch, ctx, seen, autoscaling=new)
    except Exception as exc:  # the tick survives; the resync passes again
        log.warning("autoscale: the resize pass failed: %r", exc)
        out.events.append(
            autoscale_loop.Event("Warning", "ResizePassFailed", f"{type(exc).__name__}: {exc}")
        )


def _autoscaling(out: autoscale_loop.Tick, previous: Mapping[str, Any]) -> dict[str, Any] | None:
    """`status.autoscaling` after the tick (None: no decision)."""
    dec = out.decision
    if dec is None:
        return None
    sleeping = out.sleeping()
    new: dict[str, Any] = {
        "awake": len(out.signals.replicas) - len(sleeping) if out.signals else dec.awake,
        "desired": dec.desired,
        "sleeping": sleeping,
        "reason": dec.reason,
        "message": dec.message,
    }
    new["lastScaleTime"] = _now() if out.acted else previous.get("lastScaleTime", "")
    if out.wake_s:
        new["lastWakeSeconds"] = round(max(out.wake_s), 4)
    elif "lastWakeSeconds" in previous:
        new["lastWakeSeconds"] = previous["lastWakeSeconds"]
    if not new["lastScaleTime"]:
        del new["lastScaleTime"]
    replicas = dec.replicas if dec.replicas is not None else previous.get("desiredReplicas")
    if replicas is not None:  # the plan count the reconcile gives an auto layout
        new["desiredReplicas"] = replicas
    return new
