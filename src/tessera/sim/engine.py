"""The discrete-event loop: arrivals, replica steps, control ticks and delayed actions.

Input: simulated replicas (`replica.SimReplica`), the real gateway routing rule
(`tessera.policies.routing.shares.Router`), arrivals (`arrivals.Arrival`) and optional
controllers (`control`). Output: a `SimResult` with every request's times and per-tick
samples of the cluster. Called by `tessera.sim.setup.simulate`, the CLI and the bench.

Events are (time, sequence number, kind, payload) in a heap; arrivals are merged from
their sorted list without entering the heap. A replica books a (macro-)step when it has
work; an arrival cuts a booked macro-step short (the step in progress finishes) so the
newcomer is considered at the next step boundary, as on a real agent. Stale step events
(cut or superseded) are recognised by their generation number.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

from tessera.policies.routing.shares import Router
from tessera.sim.arrivals import Arrival
from tessera.sim.replica import SimReplica, SimRequest

STEP, TICK, ACTION = 0, 1, 2


@dataclass(frozen=True)
class Done:
    """A finished request (times in seconds from the start)."""

    arrival: float
    first: float
    finish: float
    prompt: int
    output: int
    preemptions: int


@dataclass(frozen=True)
class Sample:
    """The cluster at one control tick."""

    time: float
    replicas: int
    kv_used: float  # fraction of all KV pools in use
    waiting: int
    running: int
    deployment: str  # e.g. "8x(tp1,pp1)" or "2x(tp1,pp4)+4x(tp1,pp1)"


@dataclass
class SimResult:
    done: list[Done] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    unfinished: int = 0
    events: int = 0
    steps: int = 0
    preemptions: int = 0
    actions: list[tuple[float, str]] = field(default_factory=list)  # (time, what)
    sim_seconds: float = 0.0


class Controller(Protocol):
    """A control-plane loop: called every tick with the engine."""

    def tick(self, now: float, engine: Engine) -> None: ...


class Engine:
    """Runs one simulation."""

    def __init__(
        self,
        replicas: Sequence[SimReplica],
        router: Router,
        controllers: Sequence[Controller] = (),
        tick_s: float = 1.0,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.replicas: dict[str, SimReplica] = {r.name: r for r in replicas}
        self.router = router
        self.controllers = list(controllers)
        self.tick_s = tick_s
        self.progress = progress
        self.result = SimResult()
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._gen = 0
        self.now = 0.0
        self._ready: list[str] = sorted(self.replicas)
        self._arrivals: Sequence[Arrival] = ()
        self._released = 0  # arrivals routed so far
        # dispatch(engine, arrival, ready) -> replica id: replaces the router's choice
        # (multi-tenant dispatch); the router still books the request's tokens
        self.dispatch: Callable[[Engine, Arrival, list[str]], str] | None = None

    # -- scheduling helpers ---------------------------------------------------------------
    def _push(self, when: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, kind, payload))

    def at(self, when: float, what: str, fn: Callable[[], None]) -> None:
        """Apply `fn` at `when` (a control action finishing after its modelled delay)."""
        self._push(when, ACTION, (what, fn))

    def ready(self) -> list[str]:
        return self._ready

    def refresh_ready(self) -> None:
        self._ready = sorted(
            n for n, r in self.replicas.items() if r.available_at <= self.now and r.accepting
        )

    def kick(self, rep: SimReplica) -> None:
        """Book the replica's next step if it is idle, has work and is available."""
        if rep.step is not None or not rep.has_work or rep.available_at > self.now:
            return
        self._gen += 1
        step = rep.schedule(self.now, self._gen)
        if step is not None:
            self._push(step.end, STEP, (rep.name, step.gen))

    def add_replica(self, rep: SimReplica) -> None:
        self.replicas[rep.name] = rep
        self.refresh_ready()

    def remove_replica(self, name: str) -> SimReplica:
        rep = self.replicas.pop(name)
        self.refresh_ready()
        return rep

    def requeue(self, req: SimRequest, rep: SimReplica) -> None:
        """Move a request's router accounting to `rep` (its KV moved with it)."""
        if req.ticket is not None:
            left = req.output - req.generated
            self.router.release(req.ticket)
            req.ticket = self.router.admit(rep.name, 0 if req.first >= 0 else req.prompt, left)

    # -- the loop -------------------------------------------------------------------------
    def arrivals_between(self, start: float, end: float) -> Sequence[Arrival]:
        """Arrivals already seen with start <= time < end (a gateway's counters)."""
        seen = self._arrivals[: self._released]
        times = [a.time for a in seen]
        return seen[bisect.bisect_left(times, start) : bisect.bisect_left(times, end)]

    def run(self, arrivals: Sequence[Arrival], until: float | None = None) -> SimResult:
        end = until if until is not None else (arrivals[-1].time if arrivals else 0.0)
        self._arrivals, self._released = arrivals, 0
        self._push(0.0, TICK, None)
        heap, res, router = self._heap, self.result, self.router
        i, n = 0, len(arrivals)
        horizon = end * 4 + 600.0  # let the tail drain, but never forever
        while True:
            t_arr = arrivals[i].time if i < n else float("inf")
            if heap and heap[0][0] <= t_arr:
                when, _, kind, payload = heapq.heappop(heap)
                if when > horizon:
                    break
                self.now = when
                res.events += 1
                if kind == STEP:
                    name, gen = cast(tuple[str, int], payload)
                    rep = self.replicas.get(name)
                    if rep is None or rep.step is None or rep.step.gen != gen:
                        continue
                    for req in rep.complete(when):
                        if req.finish >= 0:
                            if req.ticket is not None:
                                router.release(req.ticket)
                            res.done.append(
                                Done(
                                    req.arrival,
                                    req.first,
                                    req.finish,
                                    req.prompt,
                                    req.output,
                                    req.preemptions,
                                )
                            )
                        elif req.ticket is not None:
                            router.progress(req.ticket, 1)
                    if not rep.accepting and not rep.has_work:
                        self.remove_replica(name)  # retired by a switch and drained
                        continue
                    self.kick(rep)
                elif kind == TICK:
                    self._tick(when)
                    if i < n or any(r.has_work for r in self.replicas.values()):
                        self._push(when + self.tick_s, TICK, None)
                else:
                    what, fn = cast(tuple[str, Callable[[], None]], payload)
                    fn()
                    if what:  # an empty label: a silent re-check (a drain poll)
                        res.actions.append((when, what))
                continue
            if i >= n:
                break
            a = arrivals[i]
            i += 1
            self._released = i
            self.now = a.time
            res.events += 1
            ready = self._ready or sorted(self.replicas)
            if self.dispatch is not None:
                target = self.dispatch(self, a, ready)
            else:
                route = router.choose(ready, a.prompt, a.output)
                assert route is not None
                target = route.replica_id
            req = SimRequest(i, a.time, a.prompt, a.output, tag=a.tag)
            req.ticket = router.admit(target, a.prompt, a.output)
            rep = self.replicas[target]
            rep.push(req)
            if rep.step is None:
                self.kick(rep)
            elif rep.cut(a.time):
                self._gen += 1
                rep.step.gen = self._gen
                self._push(rep.step.end, STEP, (rep.name, self._gen))
        res.unfinished = sum(len(r.waiting) + len(r.running) for r in self.replicas.values())
        res.steps = sum(r.steps for r in self.replicas.values())
        res.preemptions = sum(r.preemptions for r in self.replicas.values())
        res.sim_seconds = self.now
        return res

    def _tick(self, now: float) -> None:
        for c in self.controllers:
            c.tick(now, self)
        reps = list(self.replicas.values())
        pool = sum(r.kv_pool_bytes() for r in reps) or 1
        shapes: dict[str, int] = {}
        for r in reps:
            key = f"(tp{r.model.tp},pp{r.model.pp})"
            shapes[key] = shapes.get(key, 0) + 1
        self.result.samples.append(
            Sample(
                now,
                len(reps),
                sum(r.kv_used_bytes() for r in reps) / pool,
                sum(len(r.waiting) for r in reps),
                sum(len(r.running) for r in reps),
                "+".join(f"{k}x{s}" for s, k in sorted(shapes.items())),
            )
        )
        if self.progress is not None:
            self.progress(now)
