"""Runs one stage across its tensor-parallel ranks: rank 0 drives, the others follow.

Rank 0 of a stage's TP group is the stage as the rest of the engine sees it (the replica
leader or the stage stream server calls its `execute`): each step is first broadcast to
the other ranks, then every rank runs its slice of the layers, the row-parallel
projections all-reduce, and all ranks end the step with the same hidden states; only rank
0's output leaves the stage. The followers loop in `follow` on a thread of their own.
While idle, rank 0 pings the followers every quarter of the group timeout, so a follower
blocked waiting for the next step tells a dead driver from a quiet one. A failed group
fails the step with the reason; the replica then reports not ready until it is reloaded.
Called by `tessera_agent.replica_groups` (agents) and by the engine tests.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

import torch

from tessera_agent.engine import errors, runner, step

log = logging.getLogger(__name__)

_STEP, _PING, _STOP = "step", "ping", "stop"


class Collective(Protocol):
    """What a TP stage needs from its group (`transfer.group.Group` provides it)."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def failed(self) -> str | None: ...

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor: ...

    def broadcast_object(self, obj: object, root: int = 0) -> object: ...

    def close(self) -> None: ...


class TPRunner(runner.StageRunner):
    """Rank 0's runner of a tensor-parallel stage. Usable once `attach`ed to its group;
    until then `execute` waits (up to `wait_s`), and after a failure it raises the reason."""

    wait_s = 120.0

    def __init__(self, base: runner.StageRunner) -> None:
        super().__init__(base.model, base.cache, base.device)
        self._group: Collective | None = None
        self._attached = threading.Event()
        self._step_lock = threading.Lock()  # a step's broadcast and collectives, or a ping
        self._stop = threading.Event()
        self.failure: str | None = None
        self.ping_s = 5.0

    @property
    def ready(self) -> bool:
        return self._group is not None and self.failure is None and self._group.failed is None

    @property
    def reason(self) -> str:
        """Why the stage cannot run now ('' when it can)."""
        if self.failure:
            return self.failure
        if self._group is None:
            return "forming its tensor-parallel group"
        return self._group.failed or ""

    def attach(self, group: Collective, ping_s: float) -> None:
        self.model.set_all_reduce(group.all_reduce)
        self._group, self.ping_s = group, ping_s
        self._attached.set()
        threading.Thread(target=self._keepalive, name="tp-keepalive", daemon=True).start()

    def fail(self, reason: str) -> None:
        self.failure = reason
        self._attached.set()

    def execute(self, inp: step.StepInput) -> step.StepOutput:
        if not self._attached.wait(self.wait_s):
            raise errors.UnavailableError("tensor-parallel group is still forming")
        group = self._group
        if self.failure is not None or group is None:
            raise errors.UnavailableError(self.failure or "tensor-parallel group is gone")
        with self._step_lock:
            try:
                group.broadcast_object((_STEP, inp))
                return super().execute(inp)
            except errors.EngineError:
                raise
            except Exception as exc:
                self.failure = f"tensor-parallel group failed: {exc}"
                raise errors.UnavailableError(self.failure) from exc

    def _keepalive(self) -> None:
        while not self._stop.wait(self.ping_s):
            group = self._group
            if group is None or not self.ready:
                return
            if self._step_lock.acquire(blocking=False):  # a running step is proof of life
                try:
                    group.broadcast_object((_PING,))
                except Exception as exc:
                    self.failure = f"tensor-parallel group failed: {exc}"
                    log.warning("%s", self.failure)
                    return
                finally:
                    self._step_lock.release()

    def close(self) -> None:
        """Tell the followers to stop, then let the group go."""
        self._stop.set()
        group = self._group
        if group is None:
            return
        if self.ready:
            with self._step_lock:
                try:
                    group.broadcast_object((_STOP,))
                except Exception as exc:  # closing anyway
                    log.info("TP stop not delivered: %s", exc)
        group.close()


def follow(base: runner.StageRunner, group: Collective) -> str:
    """Run rank `group.rank`'s slice of every step rank 0 broadcasts, until rank 0 says
    stop or the group fails; returns why it ended."""
    base.model.set_all_reduce(group.all_reduce)
    try:
        while True:
            msg = group.broadcast_object(None)
            assert isinstance(msg, tuple)
            if msg[0] == _STOP:
                return "stopped by rank 0"
            if msg[0] == _STEP:
                base.execute(msg[1])
    except Exception as exc:
        log.warning("TP rank %d of %d ended: %s", group.rank, group.size, exc)
        return f"tensor-parallel group failed: {exc}"
    finally:
        group.close()
