"""kopf handlers of the ServingDeployment resource, each a one-line call into `reconciler`.

`build_registry(cfg)` returns a fresh `kopf.OperatorRegistry` (no module-level registry):
create, spec update and resume run a reconcile pass; a timer every `cfg.resync_seconds`
re-runs it to repair drift (an agent that restarted or lost a block, one that went
down or came back); deletion runs the finalizer; `switching_loop` adds its own timer
(workload-adaptive switching, issue 11), `overload_loop` another (KunServe, every
0.5 s), `scaling_tick` another (CoCoServe module scaling), `autoscale_tick` another
(replica autoscaling, sleep and scale to zero). The login handler points
kopf at the same API server as the operator's own client. Called by `runner.py`.
"""

from __future__ import annotations

from typing import Any

import kopf

from tessera import api
from tessera_operator import (
    autoscale_tick,
    config,
    kube,
    overload_loop,
    reconciler,
    scaling_tick,
    switching_loop,
)

PLURAL = "servingdeployments"
RESOURCE = (api.API_GROUP, api.API_VERSION, PLURAL)


def build_registry(cfg: config.OperatorConfig) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(logger: kopf.Logger, **kwargs: Any) -> kopf.ConnectionInfo | None:
        return kube.login(cfg.api_server, logger, **kwargs)

    @kopf.on.create(*RESOURCE, registry=registry)
    async def created(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
        await reconciler.run(body, patch, memo)

    @kopf.on.update(*RESOURCE, field="spec", registry=registry)
    async def updated(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
        await reconciler.run(body, patch, memo)

    @kopf.on.resume(*RESOURCE, registry=registry)
    async def resumed(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
        await reconciler.run(body, patch, memo)

    @kopf.timer(
        *RESOURCE, interval=cfg.resync_seconds, initial_delay=cfg.resync_seconds, registry=registry
    )
    async def resync(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **kw: Any) -> None:
        # a stopping timer (object deleted, operator exiting) starts no pass
        if not kw["stopped"]:
            await reconciler.run(body, patch, memo, periodic=True)

    @kopf.on.delete(*RESOURCE, registry=registry)
    async def deleted(body: kopf.Body, memo: kopf.Memo, retry: int, **_: Any) -> None:
        await reconciler.finalize(body, memo, retry)

    switching_loop.register(registry, cfg, RESOURCE)
    overload_loop.register(registry, cfg, RESOURCE)
    scaling_tick.register(registry, cfg, RESOURCE)
    autoscale_tick.register(registry, cfg, RESOURCE)  # replica autoscaling (issue 32)
    return registry
