"""Module scaling in `tessera up` follows the manifest: a policy edit takes effect live.

Every applied manifest edit goes through `ScalingPolicy.sync(spec)`: turned on, the loop
starts (`make`, i.e. `scaling_loop.for_up`); changed (thresholds, steps, the TPOT target), the
running loop takes the new policy at its next tick (`ScalingLoop.reconfigure`), its layer
replicas kept; turned off, the loop stops and evicts the layer replicas it added
(`ScalingLoop.release`). The loop ticks every `--scaling-interval` seconds inside the
deployment's `observation.Pass` (`run_locked`), so a tick and a reconcile pass never
interleave. Caller: `up_cmd._serve` (after each converge pass, under the pass lock), and at
exit. The overload policy is read once at start; an edit of it is reported as needing a
restart (`overload_note`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from tessera.control import observation, scaling_loop

Say = Callable[[str], None]
Make = Callable[[Any], "scaling_loop.ScalingLoop | None"]
Run = Callable[["scaling_loop.ScalingLoop"], Coroutine[Any, Any, None]]


def _key(spec: Any) -> tuple[Any, float]:
    return spec.policies.scaling, float(spec.slo.tpot_p99_ms)


class ScalingPolicy:
    """The module-scaling loop of `tessera up`, kept in step with the manifest's spec."""

    def __init__(self, make: Make, run: Run, say: Say) -> None:
        self._make, self._run, self._say = make, run, say
        self.loop: scaling_loop.ScalingLoop | None = None
        self.task: asyncio.Task[None] | None = None
        self._key: tuple[Any, float] | None = None

    async def sync(self, spec: Any) -> bool:
        """Start, re-tune or stop the loop for `spec` (module docstring); True when it
        evicted layer replicas (the agents changed)."""
        key = _key(spec)
        if key == self._key:
            return False
        cfg, tpot_ms = key
        self._key = key
        if not cfg.enabled:
            if self.loop is None:
                return False
            await self.stop(evict=True)
            self._say("module scaling: turned off by the manifest")
            return True
        if self.loop is None:
            self.loop = self._make(spec)
            if self.loop is not None:
                self.task = asyncio.get_running_loop().create_task(self._run(self.loop))
                self._say("module scaling: on")
            return False
        self.loop.reconfigure(cfg, tpot_ms / 1e3)
        self._say("module scaling: policy changed; the next tick uses it")
        return False

    async def stop(self, evict: bool = False) -> None:
        """Stop the loop's task (at exit, or turned off: then evict what it added)."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
            self.task = None
        if evict and self.loop is not None:
            for line in await asyncio.to_thread(self.loop.release):
                self._say(line)
        self.loop = None


async def run_locked(
    loop: scaling_loop.ScalingLoop,
    stop: asyncio.Event,
    interval_s: float,
    report: Say,
    held: observation.Pass,
) -> None:
    """`loop.tick()` every `interval_s` until `stop`, each a pass of `held` (its lock
    held until the tick's thread returns, even when this task is cancelled meanwhile:
    its gRPC calls block). A tick that said anything may have acted: the pass's
    observation is dropped."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
            return
        async with held.held() as seen:
            ticking = asyncio.ensure_future(asyncio.to_thread(loop.tick))
            try:
                lines = await asyncio.shield(ticking)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):  # hold the lock until the tick is done
                    await ticking
                raise
            except Exception as exc:  # the loop must survive anything; the next tick retries
                lines = [f"module scaling tick failed: {exc!r}"]
            if lines:
                seen.acted()
        for line in lines:
            report(line)


def overload_note(started: Any, current: Any) -> str | None:
    """What to say when the manifest's overload policy differs from the running one."""
    if started.policies.overload == current.policies.overload:
        return None
    return "overload policy changed in the manifest: it takes effect when `tessera up` restarts"
