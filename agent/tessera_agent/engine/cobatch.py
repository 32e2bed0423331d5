"""The agent's compute thread, co-batching the steps of chains that share block instances.

`CoBatchExecutor` is a `concurrent.futures.Executor` (other jobs run in submission order) with
`submit_step(runner, inp)`. When several queued steps share zoo pieces it asks
`policies.serving.block_batching.plan` which run together and runs them as one co-step
(`costep.run`); the rest wait for the next co-step, ahead of newer steps. One step, or nothing
shared: the step runs alone through its `solo` callable (`StageRunner.execute`), costing one
queue hand-off. Submitting takes no Python lock (a `SimpleQueue` drained into a deque).
`run_step` reaches `submit_step`, falling back to `run_in_executor` on any other executor;
`stats` feeds metrics and tests. Created by the agent servicer (`--no-cobatch` keeps the plain
executor).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tessera.policies.serving import block_batching as bb
from tessera_agent.engine import costep, step
from tessera_agent.engine import runner as runner_mod

Solo = Callable[[step.StepInput], step.StepOutput]
Account = Callable[[float], None]
Active = Callable[[], bool]  # the chain has work left (its next step is coming)


@dataclass
class _Call:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    future: concurrent.futures.Future[Any]


@dataclass
class _Step:
    runner: runner_mod.StageRunner
    inp: step.StepInput
    solo: Solo
    account: Account | None
    future: concurrent.futures.Future[step.StepOutput]
    order: int
    active: Active | None = None
    waited: int = 0
    uses: tuple[bb.Use, ...] | None = None  # computed when it may be co-batched


@dataclass
class _Seen:
    """A chain whose step was handed back lately (a partner to wait for)."""

    runner: runner_mod.StageRunner
    at: float
    active: Active | None


@dataclass
class CoBatchStats:
    """What the thread ran (read by metrics and tests; written by the thread only)."""

    solo_steps: int = 0
    costeps: int = 0  # co-steps of two or more steps
    cobatched_steps: int = 0  # steps run inside those
    deferred: int = 0  # times a queued step was passed over (batch limit, chain busy)
    # (piece label, steps in the pass) -> passes, over co-steps
    passes: collections.Counter[tuple[str, int]] = field(default_factory=collections.Counter)
    max_pass_rows: dict[str, int] = field(default_factory=dict)  # per piece label
    # waits for expected partners: "joined" (all came) or "timeout"; seconds waited
    waits: collections.Counter[str] = field(default_factory=collections.Counter)
    wait_s: float = 0.0
    busy_s: float = 0.0  # seconds spent running steps (alone or in co-steps)

    def shared_passes(self, label: str) -> int:
        return sum(n for (lab, k), n in self.passes.items() if lab == label and k > 1)

    def own_passes(self, label: str) -> int:
        return sum(n for (lab, k), n in self.passes.items() if lab == label and k == 1)


class CoBatchExecutor(concurrent.futures.Executor):
    """One compute thread that co-batches steps sharing block instances."""

    def __init__(self, limits: bb.BatchLimits | None = None, thread_name: str = "compute") -> None:
        self.limits = limits or bb.BatchLimits()
        self.stats = CoBatchStats()
        self._inbox: queue.SimpleQueue[_Call | _Step | None] = queue.SimpleQueue()
        self._order = itertools.count()
        self._closed = False
        self._stopping = False  # the thread saw the shutdown mark
        self._seen: dict[str, _Seen] = {}  # chain -> its last step handed back
        self._pieces: dict[str, tuple[tuple[int, ...], frozenset[str]]] = {}
        self._thread = threading.Thread(target=self._work, name=thread_name, daemon=True)
        self._thread.start()

    # -- Executor ---------------------------------------------------------------------
    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        if self._closed:
            raise RuntimeError("cannot schedule new futures after shutdown")
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._inbox.put(_Call(fn, args, kwargs, fut))
        return fut

    def submit_step(
        self,
        runner: runner_mod.StageRunner,
        inp: step.StepInput,
        solo: Solo | None = None,
        account: Account | None = None,
        active: Active | None = None,
    ) -> concurrent.futures.Future[step.StepOutput]:
        """Run one step of `runner`, alone (`solo`, default `runner.execute`) or in a
        co-step; `account(seconds)` is told the compute time of a co-step it was in;
        `active()` says whether the chain will submit again (None: assume so while seen
        lately)."""
        if self._closed:
            raise RuntimeError("cannot schedule new futures after shutdown")
        fut: concurrent.futures.Future[step.StepOutput] = concurrent.futures.Future()
        job = _Step(runner, inp, solo or runner.execute, account, fut, next(self._order), active)
        self._inbox.put(job)
        return fut

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if not self._closed:
            self._closed = True
            if cancel_futures:
                while True:
                    try:
                        job = self._inbox.get_nowait()
                    except queue.Empty:
                        break
                    if job is not None:
                        job.future.cancel()
            self._inbox.put(None)
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()

    # -- the thread -------------------------------------------------------------------
    def _work(self) -> None:
        jobs: collections.deque[_Call | _Step] = collections.deque()
        while True:
            if not jobs:
                if self._stopping:  # what was queued before shutdown has run
                    return
                job = self._inbox.get()
                if job is None:
                    return
                jobs.append(job)
            self._drain(jobs)
            head = jobs[0]
            if isinstance(head, _Call):
                jobs.popleft()
                _call(head)
                continue
            if len(jobs) == 1 and not self._peers_seen(head):  # the common path
                jobs.popleft()
                self._solo(head)
                continue
            self._linger(jobs)
            try:
                self._next(jobs)
            except Exception as exc:  # a planning bug must not stop the thread
                for j in _leading(jobs):
                    jobs.remove(j)
                    if j.future.set_running_or_notify_cancel():
                        j.future.set_exception(exc)

    def _drain(self, jobs: collections.deque[_Call | _Step]) -> None:
        """Move what arrived into `jobs` (up to the shutdown mark)."""
        while not self._stopping:
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                return
            if job is None:
                self._stopping = True
                return
            jobs.append(job)

    def _peers_seen(self, head: _Step) -> bool:
        """Another chain with work left had a step handed back lately (forgetting the
        others: the common path stays one check once partners go idle)."""
        now, recent, me = time.perf_counter(), self.limits.recent_s, _chain(head.runner)
        gone = [
            c
            for c, s in self._seen.items()
            if c != me and (now - s.at > recent or (s.active is not None and not s.active()))
        ]
        for chain in gone:
            del self._seen[chain]
            self._pieces.pop(chain, None)
        return any(c != me for c in self._seen)

    def _chain_pieces(self, r: runner_mod.StageRunner) -> frozenset[str]:
        """The instances a chain uses, cached while its modules stay the same (only the
        wait for partners reads this; a co-step's plan reads the modules afresh)."""
        m = r.model
        mark = (id(m), id(m.layers), len(m.layers), id(m.lm_head), len(r.runs))
        got = self._pieces.get(_chain(r))
        if got is None or got[0] != mark:
            got = (mark, frozenset(u.piece for u in costep.uses(r)))
            self._pieces[_chain(r)] = got
        return got[1]

    def _linger(self, jobs: collections.deque[_Call | _Step]) -> None:
        """Wait (briefly) for the chains expected to bring a step to share with."""
        t0 = time.perf_counter()
        head = self._chain_pieces(_leading(jobs)[0].runner)
        while True:
            now = time.perf_counter()
            pending = frozenset(_chain(j.runner) for j in _leading(jobs))
            peers = [
                bb.Peer(
                    c,
                    self._chain_pieces(s.runner),
                    now - s.at,
                    s.active is None or s.active(),
                )
                for c, s in self._seen.items()
            ]
            missing = bb.expected(head, peers, pending, self.limits)
            wait = 0.0 if self._stopping else bb.linger_s(missing, now - t0, self.limits)
            if wait <= 0:
                if now > t0:  # it waited: did everyone expected come?
                    self.stats.waits["timeout" if missing else "joined"] += 1
                    self.stats.wait_s += now - t0
                return
            try:
                job = self._inbox.get(timeout=wait)
            except queue.Empty:
                self.stats.waits["timeout"] += 1
                self.stats.wait_s += time.perf_counter() - t0
                return
            if job is None:
                self._stopping = True
                return
            jobs.append(job)
            self._drain(jobs)

    def _next(self, jobs: collections.deque[_Call | _Step]) -> None:
        """Plan and run one co-step over the steps at the head of the queue."""
        lead = _leading(jobs)
        by_key = {j.order: j for j in lead}
        pending = []
        for j in lead:
            if j.uses is None:
                j.uses = costep.uses(j.runner) if j.inp.chunks else ()
            pending.append(
                bb.PendingStep(
                    j.order, _chain(j.runner), j.inp.num_tokens, j.uses, j.waited, j.order
                )
            )
        plan = bb.plan(pending, self.limits)
        for k in plan.waiting:
            by_key[k].waited += 1
        self.stats.deferred += len(plan.waiting)
        taken = set(plan.steps)
        kept = [j for j in jobs if not (isinstance(j, _Step) and j.order in taken)]
        jobs.clear()
        jobs.extend(kept)
        if len(plan.steps) == 1:
            self._solo(by_key[plan.steps[0]])
            return
        # a step cancelled meanwhile is left out, as the plain executor skips it
        admitted = {
            k: by_key[k] for k in plan.steps if by_key[k].future.set_running_or_notify_cancel()
        }
        t0 = time.perf_counter()
        results = costep.run({k: (j.runner, j.inp) for k, j in admitted.items()}, plan)
        spent = time.perf_counter() - t0
        self.stats.busy_s += spent
        self.stats.costeps += 1
        self.stats.cobatched_steps += len(plan.steps)
        for p in plan.passes:
            self.stats.passes[(p.label, len(p.steps))] += 1
            top = self.stats.max_pass_rows
            top[p.label] = max(top.get(p.label, 0), p.rows)
        now = time.perf_counter()
        for k, j in admitted.items():
            if j.account is not None:
                j.account(spent)
            self._seen[_chain(j.runner)] = _Seen(j.runner, now, j.active)
            res = results[k]
            if isinstance(res, Exception):
                j.future.set_exception(res)
            else:
                j.future.set_result(res)

    def _solo(self, j: _Step) -> None:
        self.stats.solo_steps += 1
        if not j.future.set_running_or_notify_cancel():
            return
        t0 = time.perf_counter()
        try:
            out = j.solo(j.inp)
        except BaseException as exc:  # the submitter's to handle
            self.stats.busy_s += time.perf_counter() - t0
            j.future.set_exception(exc)
            return
        now = time.perf_counter()
        self.stats.busy_s += now - t0
        self._seen[_chain(j.runner)] = _Seen(j.runner, now, j.active)
        j.future.set_result(out)


def _call(c: _Call) -> None:
    if not c.future.set_running_or_notify_cancel():
        return
    try:
        c.future.set_result(c.fn(*c.args, **c.kwargs))
    except BaseException as exc:
        c.future.set_exception(exc)


def _leading(jobs: collections.deque[_Call | _Step]) -> list[_Step]:
    """The steps before the first other job (which must run after them, in order)."""
    out = []
    for j in jobs:
        if not isinstance(j, _Step):
            break
        out.append(j)
    return out


def _chain(r: runner_mod.StageRunner) -> str:
    return f"{id(r):x}"


async def run_step(
    executor: concurrent.futures.Executor,
    runner: runner_mod.StageRunner,
    inp: step.StepInput,
    solo: Solo | None = None,
    account: Account | None = None,
    active: Active | None = None,
) -> step.StepOutput:
    """One step on the agent's compute executor: co-batched when it is a
    `CoBatchExecutor`, else `solo` (default `runner.execute`) through `run_in_executor`."""
    if isinstance(executor, CoBatchExecutor):
        fut = executor.submit_step(runner, inp, solo, account, active)
        return await asyncio.wrap_future(fut)
    return await asyncio.get_running_loop().run_in_executor(executor, solo or runner.execute, inp)
