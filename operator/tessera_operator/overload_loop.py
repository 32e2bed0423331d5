"""The overload loop on the cluster: a kopf timer that ticks `tessera.control.overload`.

Registered by `handlers.build_registry` (`register`): every `cfg.overload_tick_seconds` (0.5 s)
per ServingDeployment, doing nothing unless `spec.policies.overload.enabled` and `status.plan`
names at least two whole replicas. A tick takes the deployment's pass
(`reconciler.deployment_pass`; skips if one runs) and its shared observation, reads the
gateway's calls per replica (`GET /admin/v1/load`, or `cfg.gateway_admin_url`) and runs the
loop over the pass's kept channels. Routes steps rewrite the routes ConfigMap (same version,
next revision) and push it to the gateway (`routes_publish`); one taking replicas out, when
the push failed, waits until the gateway routes none of them (`GET /admin/v1/routes`). When
the agents changed, it writes `status.overload` and the `Overloaded` condition
(`overload_status.patch`, from its own task, `STATUS_KEY`, in order) and posts
`OverloadDropped` / `OverloadRestored` and the loop's own events. The loop object and the
last status written live in kopf's memo; a new operator converges from the agents.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from tessera import api, fields, observed, routes_doc
from tessera.control import gateway_load, overload_driver
from tessera.control import overload as control
from tessera.policies.overload import held as overload_held
from tessera.policies.overload import steps as overload_steps
from tessera_operator import (
    announced,
    config,
    discovery,
    gateway_objects,
    kube,
    overload_status,
    reconciler,
    routes_publish,
    timers,
)

log = logging.getLogger(__name__)
LOOP_KEY = "overload_loop"
PLURAL = "servingdeployments"
WARNED_KEY = "overload_load_warned"
STATUS_KEY = "overload_status_write"  # (the status as last written, its write task)


def register(
    registry: kopf.OperatorRegistry, cfg: config.OperatorConfig, resource: tuple[str, str, str]
) -> None:
    """Add the loop's timer to `registry` (called by `handlers.build_registry`)."""
    timers.register_timer(registry, resource, "overload_tick", cfg.overload_tick_seconds, tick, cfg)


def members(plan_status: Mapping[str, Any] | None) -> tuple[list[tuple[str, str]], int]:
    """(replica id, agent) of the whole replicas `status.plan` names, and the layer count."""
    out, num_layers = [], 0
    for r in (plan_status or {}).get("replicas") or []:
        stages = r.get("stages") or []
        for s in stages:
            num_layers = max(num_layers, int((s.get("layers") or [0, 0])[1]))
        if len(stages) == 1 and int(stages[0].get("tp") or 1) == 1 and r.get("replicaId"):
            out.append((str(r["replicaId"]), str(stages[0].get("agent") or "")))
    return out, num_layers


def load_url(cfg: config.OperatorConfig, dep: api.ServingDeployment) -> str:
    return routes_publish.admin_url(cfg, dep) + gateway_load.LOAD_PATH


def routes_url(cfg: config.OperatorConfig, dep: api.ServingDeployment) -> str:
    return routes_publish.admin_url(cfg, dep) + gateway_load.ROUTES_PATH


def _routes_writer(
    ctx: reconciler.Context,
    body: kopf.Body,
    dep: api.ServingDeployment,
    addresses: Mapping[str, str],
    cfg: config.OperatorConfig,
    session: gateway_load.AdminSession | None = None,
) -> overload_driver.SetRoutes:
    owner = gateway_objects.owner_reference(dict(body))

    async def set_routes(change: overload_steps.Routes) -> None:
        cm = await routes_publish.stored(ctx.kube, dep)
        doc = gateway_objects.published(cm) or routes_doc.RoutesDoc(())
        new = control.routes_change(doc, change, addresses)
        written = await routes_publish.write(ctx.kube, cfg, dep, owner, new, cm, session=session)
        # the next step drains them: only once the gateway sends none (a push it took
        # switched it already; else the file's way, as the kubelet refreshes it)
        if change.remove and not written.pushed:
            took = await gateway_load.wait_unrouted(
                routes_url(cfg, dep), change.remove, cfg.gateway_admin_token, session=session
            )
            if took is None:
                log.warning("the gateway still routes %s; draining anyway", change.remove)

    return set_routes


async def tick(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, cfg: config.OperatorConfig
) -> None:
    """One tick (module docstring)."""
    try:
        dep = api.parse(copy.deepcopy(dict(body)))
    except fields.FieldError:
        return  # the reconciler reports the invalid spec
    policy = dep.spec.policies.overload
    loop = memo.get(LOOP_KEY)
    if not policy.enabled:
        if isinstance(loop, control.OverloadLoop):
            await loop.close()
            memo.pop(LOOP_KEY, None)
        return
    whole, num_layers = members((body.get("status") or {}).get("plan"))
    if len(whole) < 2 or not num_layers:
        return
    deployment = reconciler.deployment_pass(memo)
    if deployment.lock.locked():
        return  # a pass (or the previous tick) runs; the next tick observes after it
    async with deployment.held(keep=True) as seen:
        ctx = reconciler.context(memo)
        try:
            calls = await gateway_load.fetch(
                load_url(cfg, dep), cfg.gateway_admin_token, reconciler.admin_session(memo)
            )
        except ValueError as exc:
            if not memo.get(WARNED_KEY):
                kopf.warn(body, reason="GatewayLoadUnavailable", message=str(exc))
                memo[WARNED_KEY] = True
            return
        memo.pop(WARNED_KEY, None)
        refs = await discovery.agent_refs(cfg, ctx.kube, dep.spec.resources.node_selector)
        address = {r.name: r.address for r in refs}
        held = [overload_held.Member(rid, a, address.get(a, "")) for rid, a in whole]
        if any(not m.address for m in held):
            return  # an agent of the plan is not discovered: the reconcile reports it
        if not isinstance(loop, control.OverloadLoop):
            driver = overload_driver.Driver(
                chunk_pages=4,
                after_step=cfg.overload_step_hook,
                channels=seen.channels,
                tls=cfg.tls,
            )
            loop = memo[LOOP_KEY] = control.OverloadLoop(driver)
        seen.retarget(refs)
        obs = await seen.get()  # the deployment's, over its kept channels
        loop.driver.set_routes = _routes_writer(
            ctx,
            body,
            dep,
            {m.replica_id: m.address for m in held},
            cfg,
            reconciler.admin_session(memo),
        )
        runs = loop.runs
        try:
            out = await loop.tick(held, policy, num_layers, obs, calls)
        finally:
            if loop.runs != runs:  # steps ran (some may have failed): observe again
                seen.acted()
        log.debug("overload tick %s/%s: %s -> %s", dep.namespace, dep.name, calls, out)
        for e in out.events:
            post = kopf.warn if e.kind == "Warning" else kopf.info
            post(body, reason=e.reason, message=e.message)
        if out.drops or out.restores:
            kopf.info(body, reason="OverloadShifted", message=control.shifted_message(out))
        if out.acted:
            _write_status(body, memo, ctx.kube, ctx.posted, dep, whole, await seen.get())


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _write_status(
    body: kopf.Body,
    memo: kopf.Memo,
    client: kube.Kube,
    posted: announced.Announced,
    dep: api.ServingDeployment,
    whole: list[tuple[str, str]],
    obs: observed.Observed,
) -> None:
    """After an acting tick: post the group events and start writing `status.overload`
    and the `Overloaded` condition (module docstring); returns at once. The previous
    status is the one this operator last wrote while the body has not caught up."""
    found = overload_status.held_groups({rid for rid, _ in whole}, obs)
    version = str(body.metadata.get("resourceVersion") or "")
    written, read, before = memo.get(STATUS_KEY) or (None, None, None)
    previous = dict(body.get("status") or {})
    if written is not None and read == version:
        previous.update(written)  # the body predates our last write
    generation = int(body.metadata.get("generation") or 0)
    change = overload_status.patch(previous, found, generation, _now())
    posted.record(body, previous.get("overload") or {}, {"groups": found})
    if not change:
        return
    url = kube.path(f"{api.API_GROUP}/{api.API_VERSION}", PLURAL, dep.namespace, dep.name)

    async def write() -> None:
        if before is not None:
            await asyncio.gather(before, return_exceptions=True)  # writes stay in order
        try:
            await client.merge_patch(url + "/status", {"status": change})
        except (kube.KubeError, OSError) as exc:  # the resync pass writes it from observation
            log.warning("overload status of %s/%s not written: %s", dep.namespace, dep.name, exc)

    state = {**previous, **change}
    memo[STATUS_KEY] = (
        {k: state.get(k) for k in ("overload", "conditions")},
        version,
        asyncio.get_running_loop().create_task(write()),
    )
