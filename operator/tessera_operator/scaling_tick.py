"""The module-scaling loop on the cluster: a kopf timer that ticks `tessera.control.scaling_loop`.

Registered by `handlers.build_registry` (`register`): every `cfg.scaling_tick_seconds` (5 s)
per ServingDeployment, doing nothing unless `spec.policies.scaling.enabled` and
`spec.slo.tpotP99Ms` is set. A tick reads the gateway's inter-token histogram (`GET /metrics`,
or `cfg.gateway_admin_url`), takes the deployment's pass (`reconciler.deployment_pass`; skips
if one runs) and runs one `ScalingLoop.tick` in a thread over the pass's shared observation and
kept channels. Each returned line becomes a `ModuleScaling` event; when it acted, a reconcile
pass runs at once under the same lock (writing `status.scaling.layerRuns` and the
`LayerRunAdded` / `LayerRunRemoved` events). Turned off, the loop evicts every layer run the
agents report. The loop lives in kopf's per-object memo; a new operator's drivers adopt the
runs the agents report (`ScalingDriver.adopt`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from tessera import api, model_facts, plan
from tessera.control import agents, converge, gateway_itl, scaling_loop
from tessera.policies.scaling import signal as sig
from tessera.rpc import transport
from tessera_operator import config, discovery, reconciler, routes_publish, timers

LOOP_KEY = "scaling_loop"
WARNED_KEY = "scaling_itl_warned"


def register(
    registry: kopf.OperatorRegistry, cfg: config.OperatorConfig, resource: tuple[str, str, str]
) -> None:
    """Add the loop's timer to `registry` (called by `handlers.build_registry`)."""
    timers.register_timer(registry, resource, "scaling_tick", cfg.scaling_tick_seconds, tick, cfg)


def metrics_url(cfg: config.OperatorConfig, dep: api.ServingDeployment) -> str:
    base = routes_publish.admin_url(cfg, dep)
    return base + gateway_itl.METRICS_PATH


async def _evict(
    memo: kopf.Memo,
    refs: list[Any],
    dep: api.ServingDeployment,
    channels: agents.Channels | None,
    tls: transport.TlsFiles | None,
) -> list[str]:
    """Evict every layer run the agents report for the deployment's replicas."""
    memo.pop(LOOP_KEY, None)
    at = [scaling_loop.AgentAt(r.name, r.address) for r in refs]
    loop = scaling_loop.ScalingLoop(
        dep.spec.policies.scaling,
        0.0,
        at,
        1,
        lambda: sig.Hist((), (), 0.0, 0.0),
        channels=channels,
        tls=tls,
    )
    return await asyncio.to_thread(loop.evict_found, plan.replica_prefix(dep.namespace, dep.name))


async def tick(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, cfg: config.OperatorConfig
) -> None:
    """One tick (module docstring)."""
    dep = timers.deployment(body)
    if dep is None:
        return
    policy, target_s = dep.spec.policies.scaling, dep.spec.slo.tpot_p99_ms / 1e3
    deployment = reconciler.deployment_pass(memo)
    if not policy.enabled or target_s <= 0:
        # level-triggered: runs reported in status (an earlier operator's too) are evicted
        runs = ((body.get("status") or {}).get("scaling") or {}).get("layerRuns")
        if (LOOP_KEY in memo or runs) and not deployment.lock.locked():
            async with deployment.held(keep=True) as seen:
                ctx = reconciler.context(memo)
                refs = await discovery.agent_refs(cfg, ctx.kube, dep.spec.resources.node_selector)
                try:
                    lines = await _evict(memo, refs, dep, seen.channels, cfg.tls)
                finally:
                    seen.acted()
                for line in lines:
                    kopf.info(body, reason="ModuleScaling", message=line)
                await reconciler.one_pass(body, patch, ctx, seen)
        return
    fetch = gateway_itl.fetch(
        metrics_url(cfg, dep), cfg.gateway_admin_token, reconciler.admin_session(memo)
    )
    hist = await timers.from_gateway(body, memo, WARNED_KEY, "GatewayMetricsUnavailable", fetch)
    if hist is None:
        return
    if deployment.lock.locked():
        return
    async with deployment.held(keep=True) as seen:
        ctx = reconciler.context(memo)
        refs = await discovery.agent_refs(cfg, ctx.kube, dep.spec.resources.node_selector)
        seen.retarget(refs)
        loop = memo.get(LOOP_KEY)
        if not isinstance(loop, scaling_loop.ScalingLoop):
            model_path = converge.resolve_model_path(dep.spec, None, cfg.model_root)
            try:
                hidden = int(model_facts.read_config(model_path)["hidden_size"])
            except (OSError, ValueError, KeyError):
                return  # the reconcile reports an unreadable model
            at = [scaling_loop.AgentAt(r.name, r.address) for r in refs]
            loop = scaling_loop.ScalingLoop(
                policy, target_s, at, hidden, lambda: hist, channels=seen.channels, tls=cfg.tls
            )
            memo[LOOP_KEY] = loop
        else:
            loop.reconfigure(policy, target_s)
            loop.agents = [scaling_loop.AgentAt(r.name, r.address) for r in refs]

        def itl(h: sig.Hist = hist) -> sig.Hist:
            return h

        loop.itl = itl
        described = await seen.replies()  # the pass's observation, shared
        acted = True  # a tick that failed may have acted part-way
        try:
            lines = await asyncio.to_thread(loop.tick, described)
            acted = bool(lines)
        finally:
            if acted:  # the agents may have changed: the next `get` observes again
                seen.acted()
        for line in lines:
            kopf.info(body, reason="ModuleScaling", message=line)
        if lines:
            await reconciler.one_pass(body, patch, ctx, seen)
