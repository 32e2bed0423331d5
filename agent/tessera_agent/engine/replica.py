"""Replica leader: drives continuous batching over the first stage and the rest of the pipeline.

The leader agent of a replica owns the scheduler and page allocator. Its loop keeps up to
`max_inflight` microbatches in flight (one per stage, at least two when pipelined; one on
a drop's pipeline of CPU stages sharing a machine) so stages on different agents compute
at once. Each step runs the local stage on the agent's compute thread, then goes
downstream through a `Downstream` (the gRPC stage stream in production, an in-process
runner chain in tests), and its sampled tokens come back to `postprocess`.
How each microbatch is cut (by sequence count, or by modelled cost while an overload drop
made the replica a pipeline and its queue is deep) is `tessera.policies.overload.microbatch`'s
decision. `busy_s()` is each stage's compute time so far (the leader's own, and the
downstream's when it reports one), for the live bubble fraction (`tessera bench overload`).
KV pins (pages held for a peer's KV move) are the `kv_pins.KVPins` mixin.
Called by the agent servicer's `Generate`, by `tessera generate` and the engine bench.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Protocol

from tessera.policies.overload import microbatch
from tessera_agent.engine import (
    cobatch,
    errors,
    kv_pins,
    page_allocator,
    runner,
    sampling,
    scheduler,
    step,
)

log = logging.getLogger(__name__)


class Downstream(Protocol):
    """The stages after the leader, seen as one: hidden states in, sampled tokens out."""

    num_pages: int  # smallest KV pool among the downstream stages

    async def submit(self, inp: step.StepInput) -> step.StepOutput: ...

    async def close(self) -> None: ...


DownstreamFactory = Callable[[], Awaitable[Downstream]]


@dataclass(frozen=True)
class ReplicaStats:
    kv_pages_total: int
    kv_pages_used: int
    running: int
    waiting: int
    preemptions: int
    prefix_hit_tokens: int = 0  # prompt tokens served from the prefix cache
    cached_pages: int = 0  # full pages registered in the prefix cache
    max_num_seqs: int = 0  # sequences per step now (module scaling's batch cut lowers it)


class ReplicaEngine(kv_pins.KVPins):
    """Leader-side engine of one replica."""

    def __init__(
        self,
        local: runner.StageRunner,
        executor: concurrent.futures.Executor,
        sched_cfg: scheduler.SchedulerConfig,
        connect_downstream: DownstreamFactory | None = None,
        max_inflight: int | None = None,
        split: microbatch.SplitConfig | None = None,
    ) -> None:
        self.local, self.executor, self.sched_cfg = local, executor, sched_cfg
        self._connect = connect_downstream
        self.max_inflight = max_inflight or (2 if connect_downstream else 1)
        self._downstream: Downstream | None = None
        self._sched: scheduler.Scheduler | None = None
        self._queues: dict[str, asyncio.Queue[scheduler.TokenEvent]] = {}
        self._inflight: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._ready_lock = asyncio.Lock()
        self._pins: set[str] = set()
        self.pin_lease_s = kv_pins.PIN_LEASE_S
        self.expired_pins = 0  # pins freed by their lease
        self._paused = False  # overload shifts: no step is scheduled while set
        self.steps = 0
        self.split = split or microbatch.SplitConfig()
        self.dropped = False  # an overload shift made this replica a pipeline (`resume`)
        self.splits: collections.Counter[str] = collections.Counter()  # microbatches by split
        self._busy = 0.0  # seconds the local stage computed
        self.loaded_max_num_seqs = sched_cfg.max_num_seqs  # a batch cut's 0 restores it
        # Variants being removed: new requests for them are refused (see `variants.py`).
        self.refused_variants: frozenset[str] = frozenset()

    # -- lifecycle --------------------------------------------------------------------
    async def _ensure_ready(self) -> scheduler.Scheduler:
        async with self._ready_lock:
            if self._sched is not None and (self._connect is None or self._downstream):
                return self._sched
            pages = self.local.cache.layout.num_pages
            if self._connect is not None:
                self._downstream = await self._connect()
                pages = min(pages, self._downstream.num_pages)
            if self._sched is None or self._sched.num_unfinished == 0:
                alloc = page_allocator.PageAllocator(
                    pages, self.local.page_size, self.sched_cfg.prefix_caching
                )
                self._sched = scheduler.Scheduler(alloc, self.sched_cfg)
            if self._loop_task is None:
                self._loop_task = asyncio.create_task(self._loop(), name="replica-loop")
            return self._sched

    async def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        for t in list(self._inflight):
            t.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        if self._downstream is not None:
            await self._downstream.close()

    def add_pages(self, num_pages: int) -> int:
        """Raise the page allocator to `num_pages` once every stage's KV pool holds them
        (a drop grew them: engine/memory_shift.py); running requests keep their pages and
        queued ones are scheduled at once. Returns the pages added."""
        if self._sched is None or num_pages <= self._sched.alloc.num_pages:
            return 0
        extra = num_pages - self._sched.alloc.num_pages
        self._sched.alloc.add_pages(extra)
        self._wake.set()
        return extra

    def live_pages(self) -> set[int]:
        """KV pages whose contents matter (held or prefix-cached); all before the first
        request (a layer-run move copies exactly these)."""
        if self._sched is None:
            return set(range(self.local.cache.layout.num_pages))
        return self._sched.alloc.live_pages()

    def stats(self) -> ReplicaStats:
        s = self._sched
        if s is None:
            return ReplicaStats(
                self.local.cache.layout.num_pages,
                0,
                0,
                0,
                0,
                max_num_seqs=self.sched_cfg.max_num_seqs,
            )
        return ReplicaStats(
            s.alloc.num_pages,
            s.alloc.used_pages,
            len(s.running),
            len(s.waiting),
            s.preemptions,
            s.prefix_hit_tokens,
            s.alloc.cached_pages,
            s.limits.max_num_seqs,
        )

    # -- overload shifts (issue 13): change the stages under running requests ---------------
    async def pause(self) -> list[int]:
        """Schedule no step and wait for the ones in flight; returns the pages whose K/V
        may be read again (held by running requests or pins, or prefix-cached: a request
        re-admitted after a preemption reuses its cached pages). Their K/V is still now, so
        a peer may copy it."""
        self._paused = True
        while self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)
        return [] if self._sched is None else self._sched.alloc.content_pages()

    async def resume(
        self, connect: DownstreamFactory | None, num_pages: int = 0, max_inflight: int = 2
    ) -> None:
        """Run again over the (possibly new) downstream stages, `max_inflight` microbatches
        in flight: `connect` None means the replica is whole now (one). Raises the
        allocator to `num_pages` when that is more."""
        if self._downstream is not None:  # the stages after the leader changed
            ds, self._downstream = self._downstream, None
            await ds.close()
        self._connect = connect
        self.max_inflight = max(1, max_inflight) if connect is not None else 1
        self.dropped = connect is not None
        if self._sched is not None and connect is not None:
            self._downstream = await connect()
        if num_pages:
            self.add_pages(num_pages)
        self._paused = False
        self._wake.set()

    def unpause(self) -> None:
        """Run again over the same stages after a pause (a KV pool resize, issue 34)."""
        self._paused = False
        self._wake.set()

    def set_max_num_seqs(self, n: int) -> int:
        """Cap the sequences per step from the next step on (module scaling's batch cut;
        0 = the loaded limit); returns the previous cap. Running requests are not stopped:
        the oldest get the step's places, the rest wait (`policies.batching`)."""
        n = n or self.loaded_max_num_seqs
        prev = self.sched_cfg.max_num_seqs
        self.sched_cfg = replace(self.sched_cfg, max_num_seqs=n)
        if self._sched is not None:
            self._sched.limits = replace(self._sched.limits, max_num_seqs=n)
        return prev

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def allocator(self) -> page_allocator.PageAllocator | None:
        return None if self._sched is None else self._sched.alloc

    @property
    def num_unfinished(self) -> int:
        return 0 if self._sched is None else self._sched.num_unfinished

    # -- requests ---------------------------------------------------------------------
    async def generate(
        self,
        seq_id: str,
        prompt: list[int],
        params: sampling.SamplingParams,
        variant: str = "",
    ) -> AsyncIterator[scheduler.TokenEvent]:
        """Yield the request's token events; cancelling the consumer cancels the request."""
        async for batch in self.generate_batches(seq_id, prompt, params, variant):
            for ev in batch:
                yield ev

    async def generate_batches(
        self,
        seq_id: str,
        prompt: list[int],
        params: sampling.SamplingParams,
        variant: str = "",
    ) -> AsyncIterator[list[scheduler.TokenEvent]]:
        """The request's token events, grouped: every event ready when the consumer asks
        comes in one list (a token and its finish together; several tokens when the
        consumer fell behind), so a streaming caller sends fewer, larger messages."""
        if variant:
            self.check_variant(variant)
        sched = await self._ensure_ready()
        queue: asyncio.Queue[scheduler.TokenEvent] = asyncio.Queue()
        sched.add(seq_id, prompt, params, variant)
        self._queues[seq_id] = queue
        self._wake.set()
        finished = False
        try:
            while True:
                batch = [await queue.get()]
                while not queue.empty() and batch[-1].finish_reason is None:
                    batch.append(queue.get_nowait())
                end = batch[-1]
                if end.finish_reason == "error":
                    finished = True
                    if len(batch) > 1:
                        yield batch[:-1]  # tokens made before the failure still count
                    raise errors.UnavailableError(end.error or "replica failed")
                if end.finish_reason is not None:
                    finished = True
                yield batch
                if finished:
                    return
        finally:
            self._queues.pop(seq_id, None)
            if not finished:
                self.cancel(seq_id)

    def check_variant(self, variant: str) -> None:
        """NotFoundError naming the served variants unless this replica serves `variant`."""
        served = set(self.local.lora[1]) if self.local.lora is not None else set()
        if variant not in served or variant in self.refused_variants:
            names = sorted(served - self.refused_variants)
            raise errors.NotFoundError(
                f"variant {variant!r} is not served by this replica (served: {names or 'none'})"
            )

    def variant_requests(self, variants: frozenset[str]) -> int:
        """Requests of these variants not finished yet (running or waiting)."""
        s = self._sched
        if s is None or not variants:
            return 0
        return sum(seq.variant in variants for seq in (*s.running, *s.waiting))

    def cancel(self, seq_id: str) -> None:
        if self._sched is not None:
            self._dispatch(self._sched.cancel(seq_id))
            self._wake.set()

    # -- loop -------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            self._fill()
            await self._wake.wait()

    def _fill(self) -> None:
        sched = self._sched
        if sched is None or self._paused:
            return
        while len(self._inflight) < self.max_inflight:
            budget = microbatch.Budget("none")
            if self.max_inflight > 1:
                window = sched.window(self.max_inflight, self.dropped)
                budget = microbatch.next_budget(window, self.split)
            planned = sched.schedule(budget.max_seqs, budget.max_tokens)
            if planned is None:
                return
            self.splits[budget.split] += 1
            # Hand the step to the compute executor first: its submission is queued ahead
            # of the token messages the caller (`_run`) hands out after this.
            computed = asyncio.ensure_future(
                cobatch.run_step(
                    self.executor,
                    self.local,
                    planned.input,
                    self._execute,
                    self._account,
                    lambda: self.num_unfinished > 0,
                )
            )
            task = asyncio.create_task(self._run(planned, computed))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _run(
        self, planned: scheduler.ScheduledStep, computed: asyncio.Future[step.StepOutput]
    ) -> None:
        assert self._sched is not None
        try:
            out = await computed
            if self._connect is not None:
                if self._downstream is None:
                    raise errors.UnavailableError("downstream stage is not connected")
                out = await self._downstream.submit(step.next_stage_input(planned.input, out))
            events = self._sched.postprocess(planned, out.sampled, out.logprobs)
            self.steps += 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a lost stage must not kill the loop: fail and reconnect
            log.warning("replica step failed: %s", exc)
            events = self._sched.fail(planned, f"replica step failed: {exc}")
            if self._downstream is not None:
                events += self._sched.fail_all(f"replica lost a stage: {exc}")
                ds, self._downstream = self._downstream, None
                await ds.close()
        # Leave the in-flight set now (done-callbacks run later) and start the next step
        # before handing out this one's tokens: the compute thread works while the loop
        # streams them (sending a token per running request is most of the loop's work).
        task = asyncio.current_task()
        if task is not None:
            self._inflight.discard(task)
        self._fill()
        self._dispatch(events)
        self._wake.set()

    def _execute(self, inp: step.StepInput) -> step.StepOutput:
        t0 = time.perf_counter()
        try:
            return self.local.execute(inp)
        finally:
            self._busy += time.perf_counter() - t0

    def _account(self, seconds: float) -> None:  # a co-step this replica's step was in
        self._busy += seconds

    def busy_s(self) -> list[float]:
        """Compute seconds per stage so far: the leader's, then each downstream stage's when
        the downstream reports them (`LocalDownstream` does; a remote one does not)."""
        ds = getattr(self._downstream, "busy_s", None)
        return [self._busy] + (list(ds) if isinstance(ds, list) else [])

    def _dispatch(self, events: list[scheduler.TokenEvent]) -> None:
        for ev in events:
            q = self._queues.get(ev.seq_id)
            if q is not None:
                q.put_nowait(ev)
