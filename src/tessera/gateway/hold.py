"""Hold requests while the deployment has no replica awake, instead of failing them.

A valid generation request that finds no ready replica while a wake can be expected (some
replica sleeps, or none is routed) waits in a bounded queue (`HoldConfig.max_held`, each at
most `deadline_s`) until one is ready; past its deadline it gets 503 `wake_timeout`, over
the bound 503 `hold_queue_full`, both with `Retry-After`; `max_held = 0` turns it off.
While anything is held it wakes the sleeping replicas (`WakeReplica`, once per episode),
refreshes readiness every `poll_s`, and counts the held requests: the autoscaler's demand
from zero (`GET /admin/v1/load`, `tessera_gateway_held_requests`; docs/scaling.md).
Called by the handlers (`app.py`) before dispatch; built by `server.start_gateway`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tessera.gateway import errors

log = logging.getLogger(__name__)

OUTCOMES = ("released", "expired", "full", "cancelled")


@dataclass(frozen=True)
class HoldConfig:
    max_held: int = 256  # requests held at once (0: no holding, 503 at once)
    deadline_s: float = 60.0  # longest a request waits for a replica (503 after)
    retry_after_s: int = 5  # the Retry-After of a hold's 503
    poll_s: float = 0.05  # readiness refresh period while anything is held

    def __post_init__(self) -> None:
        if self.max_held < 0:
            raise ValueError("max_held: must be >= 0 (0 = no holding)")
        if not self.deadline_s > 0:
            raise ValueError("deadline_s: must be > 0")
        if self.retry_after_s < 1:
            raise ValueError("retry_after_s: must be >= 1")
        if not self.poll_s > 0:
            raise ValueError("poll_s: must be > 0")


@dataclass
class HoldCounts:
    """What the holding did so far (tests, the bench, the admin document)."""

    held: int = 0  # now
    released: int = 0  # a replica became ready; the request went on
    expired: int = 0  # past the deadline: 503
    full: int = 0  # over the bound: 503 at once
    cancelled: int = 0  # the client went away while held
    wakes: int = 0  # wake calls made


class Holding:
    """The bounded hold queue of one gateway."""

    def __init__(
        self,
        cfg: HoldConfig,
        ready: Callable[[], bool],
        refresh: Callable[[], Awaitable[None]],
        wake: Callable[[], Awaitable[None]] | None = None,
        on_change: Callable[[int, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        waking: Callable[[], bool] = lambda: True,
    ) -> None:
        self.cfg = cfg
        self._ready, self._refresh, self._wake = ready, refresh, wake
        self._waking = waking  # whether a replica can be expected to wake (else: no hold)
        self._on_change = on_change  # (held now, outcome) -> metrics
        self._clock = clock
        self._event = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None
        self.counts = HoldCounts()

    @property
    def held(self) -> int:
        return self.counts.held

    def _count(self, outcome: str) -> None:
        setattr(self.counts, outcome, getattr(self.counts, outcome) + 1)
        if self._on_change is not None:
            self._on_change(self.counts.held, outcome)

    def _refused(self, message: str, code: str) -> errors.ApiError:
        return errors.ApiError(
            503, message, code=code, headers={"Retry-After": str(self.cfg.retry_after_s)}
        )

    async def wait(self) -> None:
        """Return once a replica is ready (at once when one is, or when none can be
        expected to wake: the dispatcher answers then); ApiError(503) when the queue is
        full or the deadline passes first."""
        if self._ready() or not self._waking():
            return
        cfg = self.cfg
        if cfg.max_held == 0:
            return  # no holding: the dispatcher's 503, as before
        if self.counts.held >= cfg.max_held:
            self._count("full")
            raise self._refused(
                f"no replica is awake and {self.counts.held} requests already wait for one "
                f"(limit {cfg.max_held}); retry after {cfg.retry_after_s}s",
                "hold_queue_full",
            )
        self.counts.held += 1
        self._count_held()
        outcome = "cancelled"
        try:
            self._start_watch()
            deadline = self._clock() + cfg.deadline_s
            while not self._ready():
                left = deadline - self._clock()
                if left <= 0:
                    outcome = "expired"
                    raise self._refused(
                        f"no replica became ready within {cfg.deadline_s:g}s (the deployment "
                        f"is asleep or scaled to zero and is waking); retry after "
                        f"{cfg.retry_after_s}s",
                        "wake_timeout",
                    )
                self._event.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(left, cfg.poll_s * 4)):
                        await self._event.wait()
            outcome = "released"
        finally:
            self.counts.held -= 1
            self._count(outcome)

    def _count_held(self) -> None:
        if self._on_change is not None:
            self._on_change(self.counts.held, "")

    def _start_watch(self) -> None:
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(self._watching())

    async def _watching(self) -> None:
        """While anything is held: wake the sleepers once, refresh readiness, release."""
        woke = False
        while self.counts.held > 0:
            if not woke and self._wake is not None:
                woke = True
                self.counts.wakes += 1
                try:
                    await self._wake()
                except Exception:  # the watch must survive; the deadline answers
                    log.exception("waking the sleeping replicas failed")
            try:
                await self._refresh()
            except Exception:
                log.exception("refreshing readiness while holding failed")
            if self._ready():
                self._event.set()
            await asyncio.sleep(self.cfg.poll_s)
        self._event.set()

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
