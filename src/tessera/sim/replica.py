"""A simulated replica: continuous batching with the real policy over the real KV pages.

Input: the replica's step model (`steptime.StepModel`), its KV pool in pages, batch
limits; requests pushed by the engine. Output: (macro-)steps with their duration, and per
request its first-token and finish times. Called by `tessera.sim.engine`. What runs next
is `tessera.policies.serving.batching` applied as the agent's scheduler applies it:
running sequences in `running_order`, each given `chunk_size` tokens and pages from the
real `tessera.kvpages.PageAllocator`, the newest idle one preempted (recompute) when the
pool is full; then waiting sequences FCFS. Prefix caching is off (no token ids); pipeline
stages run one round per step. Macro-steps: when a step is decodes only and nothing
waiting can be admitted, up to `max_macro` identical steps are booked at once (pages grown
up front, decode time from the starting context), cut short by the engine on an arrival.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tessera.kvpages import PageAllocator
from tessera.policies.routing.shares import Ticket
from tessera.policies.serving import batching
from tessera.sim.steptime import StepModel


@dataclass(eq=False)
class SimRequest:
    """One request's state (mutable; owned by the replica serving it)."""

    rid: int
    arrival: float
    prompt: int
    output: int
    order: int = 0  # admission order on this replica
    computed: int = 0  # tokens in the KV cache
    generated: int = 0
    first: float = -1.0  # time of the first token
    finish: float = -1.0
    preemptions: int = 0
    is_running: bool = False
    cap: int = 0  # tokens its pages hold (pages x page size): no allocation below it
    replica: str = ""
    ticket: Ticket | None = None
    tag: str = ""  # the arrival's tag (a model variant for multi-tenant replicas)
    view: batching.SeqView | None = field(default=None, repr=False)

    @property
    def pending(self) -> int:
        return self.prompt + self.generated - self.computed

    def seq_view(self) -> batching.SeqView:
        v = self.view
        p = self.prompt + self.generated - self.computed
        if v is None or v.pending != p:
            v = self.view = batching.SeqView(str(self.rid), self.order, p)
        return v


@dataclass
class Step:
    """A booked (macro-)step."""

    start: float
    dt: float  # seconds per step
    count: int  # identical steps booked
    picks: list[tuple[SimRequest, int]]
    gen: int  # the engine's event generation; a cut step gets a new one

    @property
    def end(self) -> float:
        return self.start + self.dt * self.count


class SimReplica:
    """One replica's queues, pages and current step."""

    def __init__(
        self,
        name: str,
        model: StepModel,
        num_pages: int,
        page_size: int,
        page_bytes: int,
        limits: batching.BatchLimits,
        max_macro: int = 32,
    ) -> None:
        self.name, self.model, self.limits = name, model, limits
        self.alloc = PageAllocator(num_pages, page_size, prefix_caching=False)
        self.page_size, self.page_bytes = page_size, page_bytes
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.by_id: dict[str, SimRequest] = {}
        self.step: Step | None = None
        self.max_macro = max_macro
        self._order = 0
        self.preemptions = 0
        self.steps = 0
        self.busy_s = 0.0
        self.available_at = 0.0  # a drop/restore in progress holds the replica until then
        self.accepting = True  # False: retired by a switch, drains what it holds
        self.version = 0  # bumped whenever a running sequence joins, leaves or changes
        self.memoize = True
        self._memo: tuple[int, tuple[tuple[SimRequest, int], ...], batching.Budget] | None = None

    # -- queue --------------------------------------------------------------------------
    def push(self, req: SimRequest) -> None:
        self._order += 1
        req.order, req.replica = self._order, self.name
        req.view, req.is_running = None, False
        self.by_id[str(req.rid)] = req
        self.waiting.append(req)

    @property
    def idle(self) -> bool:
        return self.step is None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- scheduling (the agent scheduler's shell over the batching policy) ---------------
    def schedule(self, now: float, gen: int) -> Step | None:
        """Book the next step at `now`; None when there is nothing to run."""
        chosen, budget, taken = self._continue_running()
        while self.waiting and not budget.exhausted:
            req = self.waiting[0]
            n = batching.chunk_size(req.pending, budget)
            if not self._grow(req, req.computed + n):
                break  # pool full: wait (FCFS) until pages are freed
            self.waiting.popleft()
            self.running.append(req)
            req.is_running = True
            self.version += 1
            chosen.append((req, n))
            taken.add(req.rid)
            budget = budget.take(n)
        if not chosen:
            return None
        decodes = ctx = logits = 0
        chunks: list[tuple[int, int]] = []
        for req, n in chosen:
            if req.generated and n == 1 and req.pending == 1:
                decodes += 1
                ctx += req.computed + 1
            else:
                chunks.append((n, req.computed))
            if req.computed + n == req.prompt + req.generated:
                logits += 1
        dt = self.step_seconds(chosen, decodes, ctx, chunks, logits)
        count = 1
        if not chunks and not self._admissible(budget):
            count = self._macro_count(chosen)
        self.step = Step(now, dt, count, chosen, gen)
        return self.step

    def step_seconds(
        self,
        chosen: list[tuple[SimRequest, int]],
        decodes: int,
        ctx: int,
        chunks: list[tuple[int, int]],
        logits: int,
    ) -> float:
        """Seconds of one step of `chosen` (the totals are precomputed); replicas whose
        step depends on which requests run where (layer replication, per-variant blocks)
        override this."""
        return self.model.seconds(decodes, ctx, chunks, logits)

    def _continue_running(
        self,
    ) -> tuple[list[tuple[SimRequest, int]], batching.Budget, set[int]]:
        """The running sequences' part of the step, as the agent's scheduler applies
        `running_order` / `chunk_size` / `preemption_victim`. The policy is pure: while no
        running sequence changed (`version`), its answer is the cached one, and only the
        pages are re-checked; any preemption falls back to the full loop."""
        memo = self._memo
        if self.memoize and memo is not None and memo[0] == self.version:
            _, picks, budget = memo
            ok = True
            for req, n in picks:
                if not self._grow(req, req.computed + n):
                    ok = False
                    break
            if ok:
                return list(picks), budget, {r.rid for r, _ in picks}
        budget = batching.start_budget(self.limits)
        chosen: list[tuple[SimRequest, int]] = []
        taken: set[int] = set()
        for view in batching.running_order([r.seq_view() for r in self.running]):
            if budget.exhausted:
                break
            req = self.by_id[view.seq_id]
            if not req.is_running:
                continue  # preempted earlier in this loop
            n = batching.chunk_size(req.pending, budget)
            if n and self._reserve(req, n, taken):
                chosen.append((req, n))
                taken.add(req.rid)
                budget = budget.take(n)
        self._memo = (self.version, tuple(chosen), budget)
        return chosen, budget, taken

    def _admissible(self, budget: batching.Budget) -> bool:
        return bool(self.waiting) and not budget.exhausted

    def _macro_count(self, chosen: list[tuple[SimRequest, int]]) -> int:
        k = self.max_macro
        for req, _ in chosen:
            left = req.output - req.generated
            if left < k:
                k = left
        if k <= 1:
            return 1
        ps, need = self.page_size, 0
        for req, _ in chosen:
            extra = req.computed + k - req.cap
            if extra > 0:
                need += -(-extra // ps)
        if need > self.alloc.free_pages:
            return 1
        for req, _ in chosen:
            self._grow(req, req.computed + k)
        return k

    def _grow(self, req: SimRequest, tokens: int) -> bool:
        """`PageAllocator.grow`, skipped when the request's pages already hold `tokens`
        (the allocator would allocate nothing)."""
        if tokens <= req.cap:
            return True
        if not self.alloc.grow(str(req.rid), tokens):
            return False
        req.cap = len(self.alloc.block_table(str(req.rid))) * self.page_size
        return True

    def _reserve(self, req: SimRequest, n: int, taken: set[int]) -> bool:
        """Grow `req` by n tokens, preempting the newest idle sequences if the pool is full."""
        while not self._grow(req, req.computed + n):
            idle = [r.seq_view() for r in self.running if r.rid not in taken]
            victim_id = batching.preemption_victim(idle)
            if victim_id is None:
                return False
            victim = self.by_id[victim_id]
            self._preempt(victim)
            if victim is req:
                return False
        return True

    def _preempt(self, req: SimRequest) -> None:
        self.alloc.free(str(req.rid))
        req.computed = req.cap = 0
        req.preemptions += 1
        self.preemptions += 1
        self.running.remove(req)
        req.is_running = False
        self.version += 1
        self.waiting.appendleft(req)

    def cut(self, now: float) -> bool:
        """Shorten the booked macro-step to the step in progress at `now`; True if cut."""
        s = self.step
        if s is None or s.count <= 1:
            return False
        done = min(s.count, int((now - s.start) / s.dt) + 1)
        if done >= s.count:
            return False
        s.count = done
        return True

    def complete(self, now: float) -> list[SimRequest]:
        """Apply the booked step's tokens; returns requests that got their first token
        (first > 0 set now) or finished (finish set)."""
        s = self.step
        assert s is not None
        self.step = None
        self.steps += s.count
        self.busy_s += s.dt * s.count
        touched: list[SimRequest] = []
        done: list[SimRequest] = []
        for req, n in s.picks:
            if req.replica != self.name:
                continue  # moved by a drop while in flight
            if s.count > 1:
                req.computed += s.count
                req.generated += s.count
            else:
                if n != 1 or req.generated == 0:
                    self.version += 1  # a prefill chunk: its pending count changes
                req.computed += n
                if req.computed == req.prompt + req.generated:
                    req.generated += 1
                    if req.generated == 1:
                        req.first = now
                        touched.append(req)
            if req.generated >= req.output:
                req.finish = now
                done.append(req)
        for req in done:
            self.alloc.free(str(req.rid))
            req.cap = 0
            self.version += 1
            self.running.remove(req)
            del self.by_id[str(req.rid)]
        return [r for r in touched if r.finish < 0] + done

    def settle(self, now: float) -> None:
        """Stop at `now` (the replica is being merged or split): keep the tokens of the
        whole steps of a macro-step done by then (none of them can finish a request); the
        step in progress is dropped and redone by the replica that takes the request."""
        s, self.step = self.step, None
        if s is None or s.count <= 1:
            return
        done = min(s.count - 1, int((now - s.start) / s.dt))
        self.steps += done
        self.busy_s += s.dt * done
        for req, _ in s.picks:
            req.computed += done
            req.generated += done

    # -- observation --------------------------------------------------------------------
    def kv_used_bytes(self) -> int:
        return self.alloc.used_pages * self.page_bytes

    def kv_pool_bytes(self) -> int:
        return self.alloc.num_pages * self.page_bytes


def adopt(rep: SimReplica, reqs: list[SimRequest]) -> None:
    """Give `rep` requests whose KV moved to it (a drop merged or a restore split their
    replicas): the oldest keep running with their pages re-booked in `rep`'s pool; those
    that do not fit, and those that were waiting, queue in arrival order."""
    reqs = sorted(reqs, key=lambda r: (r.arrival, r.rid))
    for req in reqs:
        running = req.is_running
        rep.push(req)
        req.cap = 0
        if running and rep._grow(req, req.computed):
            rep.waiting.remove(req)
            rep.running.append(req)
            req.is_running = True
            rep.version += 1
        else:
            req.computed = 0
            if running:  # no room: recompute later
                req.computed = 0
                req.preemptions += 1
                rep.preemptions += 1
