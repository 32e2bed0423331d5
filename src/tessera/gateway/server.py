"""Starts and stops a gateway in the running asyncio loop; the public entry point.

Called in-process by `tessera up` and by `tessera gateway` (`cli/gateway_cmd.py`).
`start_gateway` loads the model's tokenizer and metadata, polls every replica once (so
`/health` is right from the start), binds the HTTP port and starts the maintenance loop
(Describe polls every `poll_interval_s`, the routes file checked every `routes_check_s`).
The returned `GatewayHandle` changes replicas and class shares at run time and stops everything; a
versioned routes document (the file, `PUT /admin/v1/routes` or `apply_routes`) switches through
`cutover.Cutover`, the newest by (`version`, `revision`) winning.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence

from aiohttp import web

from tessera.gateway import (
    admin,
    admin_auth,
    app,
    arrivals,
    auth,
    chat_template,
    config,
    cutover,
    dispatch,
    hold,
    inflight,
    kv_affinity,
    metrics,
    model_info,
    replicas,
    router,
    routes,
    status_page,
    tokenizer,
)
from tessera.workload import live_classes

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 5.0  # running HTTP handlers get this long when the gateway stops


class GatewayHandle:
    """A running gateway."""

    def __init__(
        self,
        cfg: config.GatewayConfig,
        service: app.Service,
        route: router.Router,
        runner: web.AppRunner,
        url: str,
        watcher: routes.RoutesWatcher | None,
        switch: cutover.Cutover,
    ) -> None:
        self.config = cfg
        self.url = url  # http://host:port, with the real port when cfg.port was 0
        self.service = service
        self._router = route
        self._runner = runner
        self._watcher = watcher
        self.cutover = switch
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._routes_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._live: router.ClassRouter | None = None  # set_live_classifier's rule

    @property
    def model_name(self) -> str:
        return self.service.model_name

    def update_replicas(self, endpoints: Sequence[config.ReplicaEndpoint]) -> None:
        """Replace the replica list; new replicas are polled right away."""
        self.service.replicas.update(endpoints)
        self._wake.set()

    def apply_routes(self, new: routes.Routes) -> bool:
        """Apply a routes document (a higher `version` cuts over; see `cutover.py`);
        False when its version is older than the one served."""
        ok = self._apply_routes(new)
        self._wake.set()
        return ok

    def set_class_shares(
        self, shares: router.ClassShares, class_router: router.ClassRouter | None = None
    ) -> None:
        """Per-class routing: `{class: {replica: share}}` (e.g. from
        `Deployment.class_shares`) and the classifier naming a request's class (e.g.
        `router.workload_class_router(classes, deployment.classes)`). Without a
        classifier the shares are kept but unused; empty shares restore plain balancing."""
        self._router.set_class_shares(shares, class_router)

    def set_live_classifier(
        self, classifier: live_classes.LiveClassifier, names: Sequence[str]
    ) -> None:
        """Type arrivals with the live classifier (`arrivals.live_class_router`) instead of
        the routes document's class centroids."""
        assert self.service.arrivals is not None
        self._live = arrivals.live_class_router(classifier, names)
        self.service.arrivals.set_classes(self._live, names)

    def in_flight(self, replica_id: str) -> list[inflight.Attempt]:
        """Requests now on `replica_id` (the overload loop of `tessera up` reads them)."""
        return self.cutover.attempts(replica_id)

    def ready_replicas(self) -> list[str]:
        return self.service.replicas.ready_ids()

    async def refresh(self) -> None:
        """Poll every replica now (and re-read the routes file if it changed)."""
        self._reload_routes()
        await self.service.replicas.poll_once()

    def start_maintenance(self, interval_s: float, routes_check_s: float = 0.0) -> None:
        """Poll the replicas every `interval_s`; with `routes_check_s` > 0 and a routes
        file, check the file that often too (a changed one wakes the poll at once)."""
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._maintain(interval_s))
        if routes_check_s > 0 and self._watcher is not None:
            self._routes_task = loop.create_task(self._watch_routes(routes_check_s))

    async def _watch_routes(self, every_s: float) -> None:
        while not self._stopping:
            await asyncio.sleep(every_s)
            try:
                if self._reload_routes():
                    self._wake.set()  # poll the replicas it names now
            except Exception:  # the watch must survive anything; the next check retries
                log.exception("routes file check failed")

    async def _maintain(self, interval_s: float) -> None:
        while not self._stopping:
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            try:
                await self.refresh()
            except Exception:  # the loop must survive anything; the next poll retries
                log.exception("gateway maintenance failed")

    def _reload_routes(self) -> bool:
        """Apply the routes file if it changed; whether a new document was applied."""
        if self._watcher is None:
            return False
        try:
            new = self._watcher.poll()
        except ValueError as exc:
            log.error("routes file ignored, keeping the previous routes: %s", exc)
            return False
        return new is not None and self._apply_routes(new)

    def _apply_routes(self, new: routes.Routes) -> bool:
        if new.model and new.model != self.model_name:
            log.warning(
                "routes file names model %r; serving %r (restart to change)",
                new.model,
                self.model_name,
            )
        if not self.cutover.apply(new):
            return False
        self.service.replicas.closed = new.closed
        self.service.table.update(new.variants)
        classify = None
        if new.class_centroids:
            classify = router.centroid_class_router(new.class_centroids)
        self._router.set_class_shares(new.class_shares, classify)
        recorder = self.service.arrivals
        if recorder is not None and self._live is None and new.class_centroids:
            recorder.set_classes(classify, list(new.class_centroids))
        log.info(
            "routes: %d replicas, %d classes with shares", len(new.replicas), len(new.class_shares)
        )
        return True

    async def stop(self) -> None:
        """Stop serving, the maintenance loop and every agent channel. Idempotent."""
        self._stopping = True
        for task in (self._task, self._routes_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._routes_task = None
        await self.cutover.close()
        if self.service.holding is not None:
            await self.service.holding.close()
        await self._runner.cleanup()
        await self.service.replicas.close()


def _load_live_classes(path: str) -> tuple[live_classes.LiveClassifier, tuple[str, ...]]:
    """The live classifier file; ValueError naming the file when unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            return live_classes.from_json(json.load(f))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc


async def start_gateway(
    cfg: config.GatewayConfig, before_ready: Callable[[], object] | None = None
) -> GatewayHandle:
    """Load the model metadata, listen, poll the replicas once; see the module docstring.
    `before_ready` runs just before that poll, while `/health` still says unavailable
    (an entry point's `gc_heap.settle`: not under the first requests)."""
    watcher = routes.RoutesWatcher(cfg.routes_file) if cfg.routes_file else None
    initial = watcher.poll() if watcher is not None else None  # ValueError: fail at start
    name = cfg.model_name or (initial.model if initial else "")
    path = cfg.model_path or (initial.model_path if initial else "")
    if not name or not path:
        raise ValueError("model name and path: give them in the config or the routes file")
    info = model_info.ModelInfo.load(path)
    codec = tokenizer.TextCodec.load(path)
    template = chat_template.ChatTemplate(info.chat_template, info.bos_token, info.eos_token)
    gauges = metrics.GatewayMetrics()
    replica_set = replicas.ReplicaSet(
        gauges,
        cfg.poll_timeout_s,
        cfg.failure_backoff_s,
        generate_mux=cfg.generate_mux,
        tls=cfg.tls,
    )
    route = router.Router(seed=cfg.routing_seed)
    table = inflight.InFlightTable()
    switch = cutover.Cutover(replica_set, table, gauges)
    counts = arrivals.ArrivalRecorder(
        cfg.arrival_span_s, on_arrival=lambda name: gauges.class_arrivals.labels(name).inc()
    )
    box: list[GatewayHandle] = []  # the handle, once made: a hold refreshes through it

    async def refresh() -> None:
        await (box[0].refresh() if box else replica_set.poll_once())

    holding = hold.Holding(
        cfg.hold,
        lambda: bool(replica_set.ready_ids()),
        refresh,
        replica_set.wake_sleeping,
        gauges.hold_changed,
        waking=lambda: bool(replica_set.sleeping_ids()) or not replica_set.endpoints,
    )
    service = app.Service(
        model_name=name,
        info=info,
        codec=codec,
        template=template,
        dispatcher=dispatch.Dispatcher(
            replica_set,
            route,
            gauges,
            table=table,
            affinity=kv_affinity.KvAffinity(replica_set, route, gauges, cfg.routing_seed)
            if cfg.kv_dispatch
            else None,
            timeouts=cfg.limits,
        ),
        replicas=replica_set,
        metrics=gauges,
        created=int(time.time()),
        limits=cfg.limits,
        api_keys=auth.ApiKeys(cfg.api_keys_file) if cfg.api_keys_file else None,
        admin_token=admin_auth.AdminToken(cfg.admin_token_file) if cfg.admin_token_file else None,
        arrivals=counts,
        holding=holding,
    )
    application = app.build(service, cfg.max_body_bytes)
    admin.install(
        application,
        switch,
        counts,
        table,
        holding,
        apply=lambda r: box[0].apply_routes(r),
        writable=service.admin_token is not None,  # a routes push needs the admin token
    )
    status_page.install(application, service, switch, lambda: route.class_shares)
    runner = web.AppRunner(
        application,
        handler_cancellation=True,  # a client disconnect cancels its agent call
        access_log=None,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, cfg.host, cfg.port)
        await site.start()
        host, port = runner.addresses[0][:2]
        url_host = f"[{host}]" if ":" in host else host
        handle = GatewayHandle(
            cfg, service, route, runner, f"http://{url_host}:{port}", watcher, switch
        )
        box.append(handle)
        if cfg.live_classes_file:
            handle.set_live_classifier(*_load_live_classes(cfg.live_classes_file))
        if initial is not None:
            handle._apply_routes(initial)
        else:
            replica_set.update(cfg.replicas)
        if before_ready is not None:
            before_ready()
        await replica_set.poll_once()
    except BaseException:
        await runner.cleanup()
        await replica_set.close()
        raise
    handle.start_maintenance(cfg.poll_interval_s, cfg.routes_check_s)
    log.info("gateway for %s listening on %s", name, handle.url)
    return handle
