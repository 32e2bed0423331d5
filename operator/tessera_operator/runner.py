"""Runs the operator: kopf with Tessera's registry, settings and memo, until stopped.

Called by `tessera operator` (`run`, in the main thread, stopped by SIGINT/SIGTERM) and by
tests and the reconcile bench (`serve` in a thread of their own, stopped by a flag).
kopf keeps its handler progress and diff-base in annotations under
`operator.tessera.dev/`, never in status; it needs no cluster-wide CRD or namespace
listing (scanning disabled), and runs standalone unless a peering name is given.
"""

from __future__ import annotations

import asyncio
import threading

import kopf

from tessera_operator import config, handlers, kube, reconciler

ANNOTATION_PREFIX = "operator.tessera.dev"


def settings(cfg: config.OperatorConfig) -> kopf.OperatorSettings:
    s = kopf.OperatorSettings()
    s.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    s.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    s.persistence.finalizer = f"{ANNOTATION_PREFIX}/finalizer"
    s.scanning.disabled = True
    s.posting.reporting_component = "tessera-operator"
    s.posting.event_name_prefix = "tessera-"
    # A deleted object keeps its finalizer until its resync timer has exited. When the
    # deletion lands mid-pass, kopf re-checks the timer after `cancellation_polling`
    # seconds (60 by default), so a delete could hang for a minute; re-check each second.
    s.background.cancellation_polling = 1.0
    return s


async def serve(
    cfg: config.OperatorConfig,
    stop_flag: threading.Event | None = None,
    ready_flag: threading.Event | None = None,
) -> None:
    """Run until `stop_flag` is set (or the task is cancelled); set `ready_flag` once up."""
    client = kube.Kube.connect(cfg.api_server)
    ctx = reconciler.Context(cfg, client)
    try:
        await kopf.operator(
            registry=handlers.build_registry(cfg),
            settings=settings(cfg),
            memo=kopf.Memo(ctx=ctx),
            clusterwide=cfg.clusterwide,
            namespaces=list(cfg.namespaces),
            standalone=not cfg.peering,
            peering_name=cfg.peering or None,
            priority=cfg.priority,
            liveness_endpoint=cfg.liveness or None,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        for session in ctx.admin_sessions:  # the deployments' kept gateway admin sessions
            await session.close()
        client.close()


def run(cfg: config.OperatorConfig) -> int:
    asyncio.run(serve(cfg))
    return 0
