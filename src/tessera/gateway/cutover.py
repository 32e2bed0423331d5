"""The versioned replica set's cut-over: switch atomically, then drain or move the rest.

`GatewayHandle` hands every routes document to `Cutover.apply`, which switches the routable
replicas at once (one synchronous `ReplicaSet.update`: every request routed after it sees only
the new set); replicas the previous document named and the new one does not become leaving.
Every change of the set is a cut-over, also at the same `version`; a document lower in
(`version`, `revision`) is stale and ignored (file and push alike). While any replica is
leaving, a task ticks every `tick_s`: it reads the attempts on leaving replicas
(`inflight.InFlightTable`), asks `policies.drain.decide` which drain and which move where,
copies each moved request's KV prefix to its target (`kv_move.move_prefix`) while the source
keeps decoding, then redirects the attempt (the dispatcher continues it there with a
prefix-cache hit; a failed copy still redirects: the target recomputes). A leaving replica with
no attempt left is dropped from the set. `snapshot` is `GET /admin/v1/routes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tessera import routes_doc
from tessera.control import kv_move
from tessera.gateway import config, inflight, metrics, replicas, routes, stage_chain
from tessera.observability import tracing
from tessera.policies.transition import drain
from tessera.rpc import transport

log = logging.getLogger(__name__)

TICK_S = 0.1


Resolve = Callable[[str, str], Awaitable[stage_chain.Layout]]
MovePrefix = Callable[
    [tuple[int, ...], tuple[kv_move.StageRef, ...], tuple[kv_move.StageRef, ...]],
    Awaitable[kv_move.Moved],
]


async def _move_prefix(
    tokens: tuple[int, ...],
    src: tuple[kv_move.StageRef, ...],
    dst: tuple[kv_move.StageRef, ...],
    tls: transport.TlsFiles | None,
) -> kv_move.Moved:
    return await kv_move.move_prefix(tokens, src, dst, tls=tls)


@dataclass
class Leaving:
    """A replica of an earlier version that requests are still running on."""

    endpoint: config.ReplicaEndpoint
    since: float  # monotonic time of the cut-over that left it out
    deadline_s: float


class Cutover:
    """Routes versions, the leaving replicas and the drain/move loop."""

    def __init__(
        self,
        replica_set: replicas.ReplicaSet,
        table: inflight.InFlightTable,
        gauges: metrics.GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = TICK_S,
        resolve: Resolve | None = None,  # None: `stage_chain.resolve` with the set's TLS
        move_prefix: MovePrefix | None = None,  # None: `kv_move.move_prefix`, likewise
    ) -> None:
        self._replicas = replica_set
        self._table = table
        self._metrics = gauges
        self._clock = clock
        self._tick_s = tick_s
        tls = replica_set.tls
        self._resolve: Resolve = resolve or (
            lambda rid, leader: stage_chain.resolve(rid, leader, tls=tls)
        )
        self._move_prefix: MovePrefix = move_prefix or (
            lambda tokens, src, dst: _move_prefix(tokens, src, dst, tls)
        )
        self.version = 0
        self.revision = 0  # within `version`: documents order by both (routes_doc.successor)
        self._leaving: dict[str, Leaving] = {}
        self._layouts: dict[str, stage_chain.Layout] = {}  # per replica id (immutable)
        self._watched: dict[inflight.Attempt, str] = {}  # attempt -> leaving replica
        self._task: asyncio.Task[None] | None = None
        self._moves: set[asyncio.Task[None]] = set()

    # -- the switch ---------------------------------------------------------------------
    def apply(self, new: routes.Routes) -> bool:
        """Switch to `new` (module docstring); False when it is stale and was ignored."""
        if (new.version, new.revision) < (self.version, self.revision):
            log.warning(
                "routes %d.%d ignored: serving %d.%d (a newer one was pushed or read)",
                new.version,
                new.revision,
                self.version,
                self.revision,
            )
            return False
        now = self._clock()
        names = {ep.replica_id for ep in new.replicas}
        gone = [ep for ep in self._replicas.endpoints if ep.replica_id not in names]
        for ep in gone:
            self._leaving[ep.replica_id] = Leaving(ep, now, new.drain_deadline_s)
            for a in self._table.on(ep.replica_id):
                self._watched[a] = ep.replica_id  # counted when it ends, however soon
        if gone or new.version != self.version:
            log.info(
                "routes version %d -> %d: %d replicas, leaving %s",
                self.version,
                new.version,
                len(new.replicas),
                sorted(self._leaving) or "none",
            )
        self.version, self.revision = new.version, new.revision
        self._metrics.routes_version.set(new.version)
        for ep in new.replicas:
            self._leaving.pop(ep.replica_id, None)  # named again: routable again
        self._replicas.update(new.replicas)
        if self._leaving and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run())
        return True

    def attempts(self, replica_id: str) -> list[inflight.Attempt]:
        """The requests in flight on `replica_id`."""
        return self._table.on(replica_id)

    def snapshot(self) -> routes_doc.AdminRoutes:
        """`GET /admin/v1/routes`: the version, its replicas, in-flight per leaving one."""
        return routes_doc.AdminRoutes(
            self.version,
            tuple(ep.replica_id for ep in self._replicas.endpoints),
            {rid: self._table.count(rid) for rid in sorted(self._leaving)},
            self.revision,
        )

    @property
    def leaving(self) -> dict[str, Leaving]:
        return dict(self._leaving)

    # -- the drain loop -----------------------------------------------------------------
    async def _run(self) -> None:
        while self._leaving:
            try:
                await self.tick()
            except Exception:  # the loop must survive anything; the next tick retries
                log.exception("cut-over tick failed")
            await asyncio.sleep(self._tick_s)

    async def tick(self) -> None:
        """One decision round over every leaving replica (public for tests)."""
        now = self._clock()
        running: dict[inflight.Attempt, str] = {}
        for rid in self._leaving:
            for a in self._table.on(rid):
                running[a] = rid
        for a in self._watched.keys() - running.keys():
            if not a.moving:
                self._metrics.cutover_requests.labels("drained").inc()
        self._watched = running
        for rid in list(self._leaving):
            n = self._table.count(rid)
            self._metrics.leaving_in_flight.labels(rid).set(n)
            if n == 0:
                del self._leaving[rid]
                with contextlib.suppress(KeyError):
                    self._metrics.leaving_in_flight.remove(rid)
                log.info("replica %s left: no request runs on it any more", rid)
        known = {ep.replica_id for ep in self._replicas.endpoints} | self._leaving.keys()
        for rid in self._layouts.keys() - known:
            del self._layouts[rid]  # a replica gone for good: its id never comes back
        if not self._leaving:
            return
        survivors = await self._survivors()
        for rid, leaving in self._leaving.items():
            waiting = [a for a in self._table.on(rid) if not a.moving]
            if not waiting:
                continue
            cfg = drain.DrainConfig(leaving.deadline_s, now - leaving.since)
            decision = drain.decide(
                [
                    drain.InFlight(
                        a.request_id,
                        rid,
                        len(a.tokens),
                        a.remaining,
                        a.tokens_per_s(),
                        started=bool(a.generated),
                    )
                    for a in waiting
                ],
                list(survivors.values()),
                cfg,
            )
            by_id = {a.request_id: a for a in waiting}
            for m in decision.moves:
                attempt = by_id[m.request_id]
                attempt.moving = True
                s = survivors[m.target]
                need = -(-(len(attempt.tokens) + attempt.remaining) // s.page_size)
                survivors[m.target] = drain.Survivor(
                    s.replica_id, max(0, s.free_pages - need), s.page_size, s.in_flight + 1
                )
                task = asyncio.get_running_loop().create_task(
                    self._move(attempt, leaving.endpoint, m.target, copy=m.tokens > 0)
                )
                self._moves.add(task)
                task.add_done_callback(self._moves.discard)

    async def _survivors(self) -> dict[str, drain.Survivor]:
        out: dict[str, drain.Survivor] = {}
        states = self._replicas.states()
        for rid in self._replicas.ready_ids():
            st = states[rid]
            layout = await self._layout(rid, st.endpoint.address)
            if layout is None:
                continue
            free = max(0, st.pages_total - st.pages_used)
            out[rid] = drain.Survivor(rid, free, layout.page_size, self._table.count(rid))
        return out

    async def _layout(self, rid: str, leader: str) -> stage_chain.Layout | None:
        if rid not in self._layouts:
            try:
                self._layouts[rid] = await self._resolve(rid, leader)
            except stage_chain.ChainError as exc:
                log.warning("cut-over: %s", exc)
                return None
        return self._layouts[rid]

    async def _move(
        self,
        attempt: inflight.Attempt,
        source: config.ReplicaEndpoint,
        target: str,
        copy: bool = True,
    ) -> None:
        """Copy the attempt's KV prefix (unless `copy` is off: nothing computed to keep)
        to `target` and redirect the attempt there."""
        tokens = attempt.tokens
        outcome = await self._copy(attempt, source, target) if copy else "requeued"
        if attempt.redirect(target):
            self._metrics.cutover_requests.labels(outcome).inc()
            log.info(
                "cut-over: %s moved %s -> %s (%s, %d tokens)",
                attempt.request_id,
                source.replica_id,
                target,
                outcome,
                len(tokens),
            )
        else:  # it finished while its KV was copied
            self._metrics.cutover_requests.labels("drained").inc()

    async def _copy(
        self, attempt: inflight.Attempt, source: config.ReplicaEndpoint, target: str
    ) -> str:
        """Copy the attempt's KV prefix to `target`: "moved", or "recomputed" when none was."""
        outcome = "recomputed"
        tokens = attempt.tokens
        try:
            src = await self._layout(source.replica_id, source.address)
            state = self._replicas.states().get(target)
            dst = None if state is None else await self._layout(target, state.endpoint.address)
            if src is not None and dst is not None:
                with tracing.remote_span(
                    attempt.trace_parent,
                    "tessera.gateway.kv_move",
                    target=target,
                    tokens=len(tokens),
                ):
                    moved = await self._move_prefix(tokens, src.stages, dst.stages)
                if moved.tokens:
                    outcome = "moved"
        except kv_move.MoveError as exc:
            log.warning("cut-over: move of %s failed, recomputing: %s", attempt.request_id, exc)
        return outcome

    async def close(self) -> None:
        tasks = [t for t in (self._task, *self._moves) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
