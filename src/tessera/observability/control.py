"""What the control loops did: Prometheus metrics, a trace and a recent-actions list per action.

Every control action (reconcile pass, transition step, overload drop or restore, layer-run
change, switch, wake) runs inside `Recorder.action(loop, action, **attributes)`, which counts it
in `tessera_control_actions_total{loop,action,outcome}`, times it in
`tessera_control_action_duration_seconds{loop,action}`, stamps
`tessera_control_last_action_timestamp_seconds{loop}`, opens a `tessera.control.<loop>.<action>`
span (`tracing.py`), and keeps the last `keep` actions for the status page (`recent()`).
`condition(...)` sets `tessera_control_condition{deployment,type,status}`. The process's
recorder is `current()` (one per process, as `logging`): the loops of `tessera up` and the
operator report to it; tests make their own.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from tessera.observability import tracing

F = TypeVar("F", bound=Callable[..., Any])
LOOPS = ("reconcile", "transition", "overload", "scaling", "switching", "wake")
_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


@dataclass(frozen=True)
class ActionRecord:
    """One finished control action, for the status page."""

    loop: str
    action: str
    started: float  # unix time
    seconds: float
    outcome: str  # "ok" or "error"
    detail: str = ""  # what it did ("2 loads, 1 unload") or why it failed
    attributes: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "loop": self.loop,
            "action": self.action,
            "started": self.started,
            "seconds": round(self.seconds, 4),
            "outcome": self.outcome,
            "detail": self.detail,
            "attributes": dict(self.attributes),
        }


class ActionHandle:
    """What an action's body may add: a note shown on the status page and in its span."""

    def __init__(self) -> None:
        self.detail = ""

    def note(self, detail: str) -> None:
        self.detail = detail


class Recorder:
    """Control-loop metrics in a private registry, and the last actions."""

    def __init__(self, keep: int = 64) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.actions = Counter(
            "tessera_control_actions_total",
            "Control actions by loop (reconcile, transition, overload, scaling, switching, "
            "wake), action and outcome (ok, error)",
            ["loop", "action", "outcome"],
            registry=r,
        )
        self.duration = Histogram(
            "tessera_control_action_duration_seconds",
            "Duration of control actions (a reconcile pass, a transition, a drop...)",
            ["loop", "action"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.last = Gauge(
            "tessera_control_last_action_timestamp_seconds",
            "Unix time the loop's last action ended",
            ["loop"],
            registry=r,
        )
        self.conditions = Gauge(
            "tessera_control_condition",
            "1 for the status each condition of a deployment has now, 0 for the others",
            ["deployment", "type", "status"],
            registry=r,
        )
        self.reasons = Gauge(
            "tessera_control_reconcile_reason",
            "1 for the reason the last reconcile pass of a deployment ended with (Serving, "
            "Loading, Switching, InsufficientCapacity...), 0 for the reasons it had before",
            ["deployment", "reason"],
            registry=r,
        )
        self._reasons: dict[str, set[str]] = {}
        self._recent: deque[ActionRecord] = deque(maxlen=keep)
        self._lock = threading.Lock()  # the operator's loops run on several threads

    @contextlib.contextmanager
    def action(self, loop: str, action: str, **attributes: Any) -> Iterator[ActionHandle]:
        """Run one control action inside: counted, timed, traced and remembered."""
        handle = ActionHandle()
        started, t0 = time.time(), time.monotonic()
        outcome = "error"
        with tracing.span(f"tessera.control.{loop}.{action}", **attributes) as span:
            try:
                yield handle
                outcome = "ok"
            except BaseException as exc:
                handle.detail = handle.detail or f"{type(exc).__name__}: {exc}"
                raise
            finally:
                seconds = time.monotonic() - t0
                if span is not None and handle.detail:
                    span.set_attribute("tessera.detail", handle.detail)
                self._finish(loop, action, started, seconds, outcome, handle.detail, attributes)

    def _finish(
        self,
        loop: str,
        action: str,
        started: float,
        seconds: float,
        outcome: str,
        detail: str,
        attributes: dict[str, Any],
    ) -> None:
        self.actions.labels(loop, action, outcome).inc()
        self.duration.labels(loop, action).observe(seconds)
        self.last.labels(loop).set(started + seconds)
        rec = ActionRecord(
            loop,
            action,
            started,
            seconds,
            outcome,
            detail,
            {k: str(v) for k, v in attributes.items()},
        )
        with self._lock:
            self._recent.append(rec)

    def note(self, loop: str, action: str, detail: str = "", **attributes: Any) -> None:
        """An instantaneous action (a decision written, not run here: a layout switch)."""
        with self.action(loop, action, **attributes) as handle:
            handle.note(detail)

    def step(
        self, loop: str, action: str, began: float, ok: bool, detail: str, **attributes: Any
    ) -> None:
        """A step that ran from `began` (`time.monotonic()`) until now: a transition step."""
        seconds = time.monotonic() - began
        outcome = "ok" if ok else "error"
        started = time.time() - seconds
        if tracing.enabled():
            h = tracing.open_span(f"tessera.control.{loop}.{action}", **attributes)
            h.end(detail=detail, outcome=outcome)
        self._finish(loop, action, started, seconds, outcome, detail, attributes)

    def outcome(self, deployment: str, reason: str) -> None:
        """A reconcile pass of `deployment` ended with condition reason `reason`."""
        with self._lock:
            seen = self._reasons.setdefault(deployment, set())
            seen.add(reason)
            for r in seen:
                self.reasons.labels(deployment, r).set(1.0 if r == reason else 0.0)
        self.condition(deployment, "Ready", "True" if reason == "Serving" else "False")

    def condition(self, deployment: str, type_: str, status: str) -> None:
        """Condition `type_` of `deployment` now has `status` ("True", "False", "Unknown")."""
        for s in ("True", "False", "Unknown"):
            self.conditions.labels(deployment, type_, s).set(1.0 if s == status else 0.0)

    def recent(self) -> list[ActionRecord]:
        """The last actions, oldest first."""
        with self._lock:
            return list(self._recent)

    def last_per_loop(self) -> dict[str, ActionRecord]:
        """Each loop's latest action."""
        out: dict[str, ActionRecord] = {}
        for rec in self.recent():
            out[rec.loop] = rec
        return out


class _Process:
    recorder: Recorder | None = None


def current() -> Recorder:
    """The process's recorder (made on first use)."""
    if _Process.recorder is None:
        _Process.recorder = Recorder()
    return _Process.recorder


def reconcile_pass(fn: F) -> F:
    """Decorator of the converge pass (`converge(dep, ...) -> Outcome`): each call is a
    `reconcile/pass` action, and its outcome's reason the deployment's reason."""

    @functools.wraps(fn)
    async def wrapper(dep: Any, *args: Any, **kwargs: Any) -> Any:
        name = f"{dep.namespace}.{dep.name}"
        rec = current()
        with rec.action("reconcile", "pass", deployment=name) as handle:
            out = await fn(dep, *args, **kwargs)
            handle.note(f"{out.reason}: {out.message}" if out.message else out.reason)
        rec.outcome(name, out.reason)
        return out

    return cast(F, wrapper)


def serve(port: int, host: str = "0.0.0.0") -> None:
    """Serve the process recorder's metrics on /metrics (a daemon thread): the operator."""
    start_http_server(port, addr=host, registry=current().registry)


def action(loop: str, action_: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """`current().action(...)`: the one-line hook the loops use."""
    return current().action(loop, action_, **attributes)
