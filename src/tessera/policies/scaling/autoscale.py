"""Replica autoscaling on serving signals: how many replicas stay awake, which wake, which sleep.

Input: `Signals` (per planned replica: awake, running and waiting requests, KV use, idle time;
the gateway's held requests, calls without a token, p99 TTFT), `AutoscaleConfig` (`spec.scaling`)
and the loop's `Memory`. Output: a `Decision` (awake count, replicas to wake and to sleep, a
reason, the new memory). Rules in order: from zero with any demand, enough replicas at once;
out when the queue per replica, mean KV use (`kv_high`) or p99 TTFT is too high, at most once
per `up_cooldown_s`; idle replicas sleep after `sleep_after_s` (down to the minimum, 0 = scale
to zero); in by one after `scale_down_after_s` calm (`kv_low`; hysteresis). The count stays in
[min, max]; only a replica with no request sleeps, so scaling in drops none. With
`Signals.resizable` (an auto layout) `Decision.replicas` grows or shrinks the plan (shrink when
a stopping replica's host cache has no room), one resize at a time (docs/scaling.md). Pure;
called by `tessera.control.autoscale_loop` each tick.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.policy_config import AutoscaleConfig as AutoscaleConfig

FROM_ZERO = "ScaleFromZero"
OUT = "ScaleOut"
IN = "ScaleIn"
IDLE = "SleepIdle"
TO_ZERO = "ScaleToZero"
FLOOR = "MinReplicas"
CAP = "MaxReplicas"
STEADY = "Steady"
COOLDOWN = "Cooldown"


@dataclass(frozen=True)
class ReplicaLoad:
    """One planned replica as observed this tick."""

    replica_id: str
    awake: bool  # not sleeping (a waking replica is awake)
    running: int = 0
    waiting: int = 0
    kv_used: float = 0.0  # fraction of its KV pool in use
    idle_s: float = 0.0  # since it last had a request (0 while it has one)
    cache_room: bool = True  # its leader's host cache can take its blocks (a sleep keeps them)

    @property
    def empty(self) -> bool:
        return self.running == 0 and self.waiting == 0


@dataclass(frozen=True)
class Signals:
    replicas: tuple[ReplicaLoad, ...]
    now: float  # seconds, the loop's clock
    held: int = 0  # requests the gateway holds for a replica to wake
    queued: int = 0  # gateway calls with no token yet (waiting somewhere)
    ttft_p99_s: float | None = None  # observed recently; None: no sample
    planned: int = 0  # replicas in the plan, loading ones included (0: len(replicas))
    target: int | None = None  # the plan count last asked for (status); None: never
    resizable: bool = False  # an auto layout: the plan's count follows `Decision.replicas`

    @property
    def plan_count(self) -> int:
        return max(self.planned, len(self.replicas))

    @property
    def shrinking(self) -> bool:
        """A smaller plan was asked for and the plan has not followed yet."""
        return self.target is not None and self.target < self.plan_count


@dataclass(frozen=True)
class Memory:
    """What the loop carries between ticks (only for the hysteresis)."""

    last_up_at: float = -math.inf
    last_down_at: float = -math.inf
    calm_since: float | None = None


@dataclass(frozen=True)
class Decision:
    desired: int  # replicas to keep awake
    awake: int  # awake now
    wake: tuple[str, ...] = ()
    sleep: tuple[str, ...] = ()
    reason: str = STEADY
    message: str = ""
    memory: Memory = field(default_factory=Memory)
    replicas: int | None = None  # the plan's replica count to ask for; None: unchanged

    @property
    def acted(self) -> bool:
        return bool(self.wake or self.sleep) or self.replicas is not None


def queue_of(s: Signals) -> int:
    """Requests waiting for a replica: held by the gateway plus waiting at the replicas
    (the gateway's count of calls with no token when it sees more)."""
    waiting = sum(r.waiting for r in s.replicas if r.awake)
    return s.held + max(waiting, s.queued)


def decide(s: Signals, cfg: AutoscaleConfig, mem: Memory) -> Decision:
    """The desired awake count and the steps toward it (module docstring)."""
    planned = len(s.replicas)
    cap = min(cfg.max_replicas or planned, planned)
    floor = min(cfg.min_replicas, cap)
    awake = [r for r in s.replicas if r.awake]
    n = len(awake)
    queue = queue_of(s)
    kv = sum(r.kv_used for r in awake) / n if n else 0.0
    slow = bool(cfg.ttft_slo_s and s.ttft_p99_s is not None and s.ttft_p99_s > cfg.ttft_slo_s)
    by_queue = math.ceil(queue / cfg.queue_per_replica) if queue else 0
    if n < floor:
        return _to(s, mem, n, floor, FLOOR, f"{n} awake, below the minimum {floor}")
    if n > cap:
        return _to(s, mem, n, cap, CAP, f"{n} awake, above the maximum {cap}", cfg)
    if n == 0:
        if queue == 0:
            return Decision(0, 0, reason=STEADY, message="asleep, no demand", memory=mem)
        want = min(cap, max(1, by_queue))
        return _to(s, mem, 0, want, FROM_ZERO, f"{queue} requests wait, no replica awake")
    pressure = []
    if by_queue > n:
        pressure.append(f"{queue} waiting > {cfg.queue_per_replica:g} x {n} replicas")
    if kv > cfg.kv_high:
        pressure.append(f"KV use {kv:.2f} > {cfg.kv_high:g}")
    if slow:
        pressure.append(f"p99 TTFT {s.ttft_p99_s:.3f}s > SLO {cfg.ttft_slo_s:g}s")
    if pressure:
        calm = dataclasses.replace(mem, calm_since=None)
        total = max(n + 1, by_queue)
        want = min(cap, total)
        grow = _grown(s, cfg, total)
        if want <= n and grow is None:
            return Decision(n, n, reason=CAP, message="; ".join(pressure) + " (at max)",
                            memory=calm)  # fmt: skip
        if s.now - mem.last_up_at < cfg.up_cooldown_s:
            return Decision(n, n, reason=COOLDOWN, message="; ".join(pressure), memory=calm)
        out = _to(s, calm, n, want, OUT, "; ".join(pressure))
        if grow is None:
            return out
        why = f"{out.message}; plan {s.plan_count} -> {grow} replicas"
        up = dataclasses.replace(calm, last_up_at=s.now)
        return dataclasses.replace(out, reason=OUT, message=why, memory=up, replicas=grow)
    if queue or kv >= cfg.kv_low:
        return Decision(n, n, reason=STEADY, memory=dataclasses.replace(mem, calm_since=None))
    calm_since = mem.calm_since if mem.calm_since is not None else s.now
    mem = dataclasses.replace(mem, calm_since=calm_since)
    if cfg.sleep_after_s > 0 and not s.held:
        idle = [r for r in awake if r.empty and r.idle_s >= cfg.sleep_after_s]
        k = min(len(idle), n - floor)
        if k > 0:
            reason = TO_ZERO if k == n else IDLE
            return _to(s, mem, n, n - k, reason, f"{k} idle >= {cfg.sleep_after_s:g}s", cfg)
    quiet = s.now - calm_since >= cfg.scale_down_after_s
    settled = s.now - max(mem.last_up_at, mem.last_down_at) >= cfg.scale_down_after_s
    if n > floor and quiet and settled and any(r.empty for r in awake):
        why = f"calm for {s.now - calm_since:.0f}s (KV use {kv:.2f})"
        return _to(s, mem, n, n - 1, IN, why, cfg)
    return Decision(n, n, reason=STEADY, memory=mem)


def _grown(s: Signals, cfg: AutoscaleConfig, total: int) -> int | None:
    """The bigger plan count when `total` replicas are wanted and the plan, every sleeper
    woken, has fewer (None: no growth: a fixed layout, no `max`, or at it)."""
    if not s.resizable or not cfg.max_replicas or s.shrinking:
        return None
    have = max(s.plan_count, s.target or 0)  # a growth asked for and still loading counts
    grow = min(cfg.max_replicas, max(have, total))
    return grow if grow > have else None


def _shrink(s: Signals, cfg: AutoscaleConfig, stopping: Sequence[ReplicaLoad]) -> int:
    """How many of `stopping` leave the plan instead of sleeping: those whose host cache
    has no room for them, down to max(1, min) planned, one resize at a time."""
    if not s.resizable or s.shrinking:
        return 0
    base = min(s.plan_count, s.target if s.target is not None else s.plan_count)
    roomless = sum(1 for r in stopping if not r.cache_room)
    return max(0, min(roomless, base - max(1, cfg.min_replicas)))


def _to(
    s: Signals,
    mem: Memory,
    n: int,
    want: int,
    reason: str,
    why: str,
    cfg: AutoscaleConfig | None = None,
) -> Decision:
    """The steps from `n` awake to `want`: wake the sleepers in id order; sleep the
    emptiest, longest idle replicas (never one with requests), or shrink the plan for
    those with no host cache room (`_shrink`; the reconcile drains the plan's last)."""
    if want > n:
        sleepers = sorted(r.replica_id for r in s.replicas if not r.awake)
        wake = tuple(sleepers[: want - n])
        new = dataclasses.replace(mem, last_up_at=s.now, calm_since=None)
        return Decision(want, n, wake=wake, reason=reason, message=why, memory=new)
    if want < n and s.resizable and s.shrinking:
        return Decision(n, n, reason=STEADY, message=f"{why}; a shrink is pending", memory=mem)
    if want < n:
        empty = sorted(
            (r for r in s.replicas if r.awake and r.empty), key=lambda r: (-r.idle_s, r.replica_id)
        )
        stopping = empty[: n - want]
        if not stopping:
            return Decision(n, n, reason=STEADY, message=f"{why}; every replica busy", memory=mem)
        new = dataclasses.replace(mem, last_down_at=s.now)
        gone = _shrink(s, cfg, stopping) if cfg is not None else 0
        if gone:
            roomless = [r for r in stopping if not r.cache_room][:gone]
            rest = tuple(r.replica_id for r in stopping if r not in roomless)
            count = min(s.plan_count, s.target if s.target is not None else s.plan_count)
            msg = f"{why}; no host cache room: plan {s.plan_count} -> {count - gone} replicas"
            return Decision(n - len(stopping), n, sleep=rest, reason=reason, message=msg,
                            memory=new, replicas=count - gone)  # fmt: skip
        sleep = tuple(r.replica_id for r in stopping)
        return Decision(n - len(sleep), n, sleep=sleep, reason=reason, message=why, memory=new)
    return Decision(n, n, reason=STEADY, message=why, memory=mem)


def plan_cap(
    enabled: bool, layout_mode: str, autoscaling: Mapping[str, Any] | None, maximum: int = 0
) -> int | None:
    """The plan count a reconcile pass gives an auto layout: `status.autoscaling.
    desiredReplicas` while the autoscaler is on, at most `maximum` (`replicas.max`, 0: no
    bound; a lowered max takes effect at once); None: the planner's own count."""
    if not enabled or layout_mode != "auto":
        return None
    value = (autoscaling or {}).get("desiredReplicas")
    if not isinstance(value, int) or value <= 0:
        return None
    return min(value, maximum) if maximum > 0 else value


def replica_seconds(awake_counts: Sequence[tuple[float, int]]) -> float:
    """Replica-seconds of a piecewise-constant awake count [(since, count), ...] up to the
    last entry's time (the bench's cost measure)."""
    total = 0.0
    for (t0, c), (t1, _) in itertools.pairwise(awake_counts):
        total += c * (t1 - t0)
    return total
