"""KunServe overload monitor: when does a replica's KV demand overflow, and when to restore.

Input: per replica a `ReplicaKV` snapshot (pool, bytes held by running requests, bytes each
queued request needs, the pre-drop pool) and an `OverloadConfig` from
`spec.policies.overload`. Output: an `OverloadDecision` (fire or not, the bytes R to free, a
reason, per-replica verdicts) and a `RestoreDecision` per dropped group. Demand, not use: held
KV + KV needed by the queued requests, so a memory-blocked queue signals early. A replica with
a queue fires at demand >= `dropThreshold` (0.9) x pool; an empty queue never fires. R is the
firing replicas' queued demand. A group restores when its whole demand stays below
`restoreThreshold` (0.5) x its pre-drop pools for `restore_hold_s` (1 s, `hold_restore`); the
gap between thresholds and the hold are the hysteresis. Called by the overload loop and
`tessera bench overload`; the drop itself is `drop_plan.py`. Rationale: docs/overload.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tessera.policy_config import DEFAULT_DROP_THRESHOLD as DEFAULT_DROP_THRESHOLD
from tessera.policy_config import DEFAULT_RESTORE_THRESHOLD as DEFAULT_RESTORE_THRESHOLD
from tessera.policy_config import OverloadConfig as OverloadConfig

REASON_OVERLOAD = "KVOverload"
REASON_OK = "KVWithinPool"
REASON_RESTORE = "DemandFell"
REASON_HOLD = "DemandHigh"
REASON_HOLD_TIME = "DemandFellRecently"


@dataclass(frozen=True)
class ReplicaKV:
    """One replica's KV snapshot, in bytes (pages x page bytes)."""

    name: str
    pool_bytes: int  # the KV pool now (grown if the replica dropped layers)
    running_bytes: int  # KV held by running requests
    queued_bytes: tuple[int, ...] = ()  # KV each queued request needs, in queue order
    pre_drop_pool_bytes: int = 0  # the pool before any drop; 0 = pool_bytes

    @property
    def base_pool_bytes(self) -> int:
        return self.pre_drop_pool_bytes or self.pool_bytes


@dataclass(frozen=True)
class ReplicaVerdict:
    name: str
    demand_bytes: int  # running + head-of-line queued
    queued_bytes: int
    pool_bytes: int
    fires: bool

    @property
    def demand_ratio(self) -> float:
        return self.demand_bytes / self.pool_bytes if self.pool_bytes else float("inf")


@dataclass(frozen=True)
class OverloadDecision:
    fire: bool
    required_bytes: int  # R for the drop plan
    reason: str
    message: str
    replicas: tuple[ReplicaVerdict, ...]


@dataclass(frozen=True)
class RestoreDecision:
    restore: bool
    demand_bytes: int
    limit_bytes: int  # restore_threshold x pre-drop pools
    reason: str
    message: str


def request_kv_bytes(
    prompt_tokens: int, output_tokens: int, page_size: int, bytes_per_page: int
) -> int:
    """KV bytes a request needs for its prompt plus `output_tokens` expected outputs,
    rounded up to whole pages as the page allocator hands them out."""
    tokens = max(0, prompt_tokens) + max(0, output_tokens)
    return -(-tokens // page_size) * bytes_per_page


def verdict(kv: ReplicaKV, cfg: OverloadConfig) -> ReplicaVerdict:
    """One replica's demand and whether it fires (see the module docstring)."""
    head = kv.queued_bytes[: cfg.head_of_line] if cfg.head_of_line else kv.queued_bytes
    queued = sum(head)
    demand = kv.running_bytes + queued
    fires = queued > 0 and demand >= cfg.drop_threshold * kv.pool_bytes
    return ReplicaVerdict(kv.name, demand, queued, kv.pool_bytes, fires)


def assess(replicas: Sequence[ReplicaKV], cfg: OverloadConfig) -> OverloadDecision:
    """Fire when any replica's demand reaches the threshold; R = their queued demand."""
    verdicts = tuple(verdict(r, cfg) for r in replicas)
    firing = [v for v in verdicts if v.fires]
    if not cfg.enabled or not firing:
        why = "overload policy disabled" if not cfg.enabled else "every replica's demand fits"
        return OverloadDecision(False, 0, REASON_OK, why, verdicts)
    required = sum(v.queued_bytes for v in firing)
    names = ", ".join(f"{v.name} ({v.demand_ratio:.0%} of pool)" for v in firing)
    return OverloadDecision(
        True,
        required,
        REASON_OVERLOAD,
        f"KV demand overflows on {names}; R={required} bytes",
        verdicts,
    )


def assess_restore(group: Sequence[ReplicaKV], cfg: OverloadConfig) -> RestoreDecision:
    """Whether a dropped group's members may return to whole-model execution."""
    demand = sum(r.running_bytes + sum(r.queued_bytes) for r in group)
    limit = int(cfg.restore_threshold * sum(r.base_pool_bytes for r in group))
    if demand < limit:
        return RestoreDecision(
            True,
            demand,
            limit,
            REASON_RESTORE,
            f"KV demand {demand} bytes is below {cfg.restore_threshold:.0%} of the pre-drop "
            f"pools ({limit} bytes): restore",
        )
    return RestoreDecision(
        False,
        demand,
        limit,
        REASON_HOLD,
        f"KV demand {demand} bytes is not below {limit} bytes: stay dropped",
    )


@dataclass(frozen=True)
class HeldRestore:
    """`assess_restore`'s decision held back until demand stayed low for `restore_hold_s`."""

    decision: RestoreDecision
    below_since: float | None  # when demand fell below the threshold; None while it is not


def hold_restore(
    decision: RestoreDecision, below_since: float | None, now: float, cfg: OverloadConfig
) -> HeldRestore:
    """Restore only once `decision` said restore at every look since `below_since` for
    `cfg.restore_hold_s` seconds (`now`, `below_since`: one monotonic clock). The caller
    keeps `below_since` per group between looks; losing it (a new operator) only delays a
    restore by one hold."""
    if not decision.restore:
        return HeldRestore(decision, None)
    since = now if below_since is None else below_since
    if now - since >= cfg.restore_hold_s:
        return HeldRestore(decision, since)
    waiting = RestoreDecision(
        False,
        decision.demand_bytes,
        decision.limit_bytes,
        REASON_HOLD_TIME,
        f"KV demand {decision.demand_bytes} bytes is below {decision.limit_bytes} bytes since "
        f"{now - since:.2f} s: restore after {cfg.restore_hold_s:g} s",
    )
    return HeldRestore(waiting, since)
