"""The elastic policies' configuration types: `spec.policies.overload`, `.scaling` and
`spec.scaling` (replica autoscaling, sleep and scale to zero: `AutoscaleConfig`).

Types, not decisions: `api_policies` parses the manifest into them and the policies that
decide with them (`policies.overload`, `policies.module_scaling`, which re-export them)
import them from here, so the types layer (`api`) never imports a decision (the layers
contract in pyproject.toml). Validated in `__post_init__`; pure.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_DROP_THRESHOLD = 0.9
DEFAULT_RESTORE_THRESHOLD = 0.5
DEFAULT_RESTORE_HOLD_S = 1.0
DEFAULT_UP_IDLE_FRACTION = 0.5
DEFAULT_DOWN_VIOLATION_RATE = 0.05
DEFAULT_BATCH_STEP = 5
DEFAULT_MAX_MIGRATIONS = 4
DEFAULT_EVICT_AFTER_S = 60.0


@dataclass(frozen=True)
class OverloadConfig:
    """`spec.policies.overload`, validated."""

    enabled: bool = False
    drop_threshold: float = DEFAULT_DROP_THRESHOLD  # fraction of the pool (0, 1]
    restore_threshold: float = DEFAULT_RESTORE_THRESHOLD  # fraction of the pre-drop pool
    head_of_line: int = 0  # queued requests counted in the demand; 0 = the whole queue
    # a restore waits until the group's demand has stayed below the threshold this long
    restore_hold_s: float = DEFAULT_RESTORE_HOLD_S

    def __post_init__(self) -> None:
        if not 0.0 < self.drop_threshold <= 1.0:
            raise ValueError(f"drop_threshold: must be in (0, 1], got {self.drop_threshold}")
        if not 0.0 < self.restore_threshold < self.drop_threshold:
            raise ValueError(
                f"restore_threshold: must be in (0, drop_threshold={self.drop_threshold}), "
                f"got {self.restore_threshold}"
            )
        if self.head_of_line < 0:
            raise ValueError("head_of_line: must be >= 0")
        if not self.restore_hold_s >= 0.0:
            raise ValueError(f"restore_hold_s: must be >= 0, got {self.restore_hold_s}")


@dataclass(frozen=True)
class ScalingConfig:
    """`spec.policies.scaling`, validated."""

    enabled: bool = False
    up_idle_fraction: float = DEFAULT_UP_IDLE_FRACTION
    down_violation_rate: float = DEFAULT_DOWN_VIOLATION_RATE
    batch_step: int = DEFAULT_BATCH_STEP
    max_migrations: int = DEFAULT_MAX_MIGRATIONS
    # layer replicas are evicted once no window violated the TPOT target for this long
    evict_after_seconds: float = DEFAULT_EVICT_AFTER_S

    def __post_init__(self) -> None:
        if not 0.0 <= self.up_idle_fraction < 1.0:
            raise ValueError(f"up_idle_fraction: must be in [0, 1), got {self.up_idle_fraction}")
        if not 0.0 <= self.down_violation_rate < 1.0:
            raise ValueError(
                f"down_violation_rate: must be in [0, 1), got {self.down_violation_rate}"
            )
        if self.batch_step < 1:
            raise ValueError("batch_step: must be >= 1")
        if self.max_migrations < 0:
            raise ValueError("max_migrations: must be >= 0")
        if not self.evict_after_seconds > 0:
            raise ValueError(f"evict_after_seconds: must be > 0, got {self.evict_after_seconds}")


@dataclass(frozen=True)
class AutoscaleConfig:
    """`spec.scaling` (docs/scaling.md), validated: how many replicas are awake."""

    enabled: bool = False
    min_replicas: int = 1  # 0 allows scale to zero
    max_replicas: int = 0  # 0: every planned replica
    sleep_after_s: float = 0.0  # an awake replica idle this long sleeps; 0: never
    queue_per_replica: float = 4.0  # waiting requests (held included) one replica absorbs
    kv_high: float = 0.85  # mean KV use above this: one replica more
    kv_low: float = 0.3  # below this with no queue for `scale_down_after_s`: one fewer
    ttft_slo_s: float = 0.0  # observed p99 TTFT above this: one replica more (0: no SLO)
    scale_down_after_s: float = 30.0  # calm this long before scaling in (hysteresis)
    up_cooldown_s: float = 5.0  # between two scale-outs (from zero is never held back)
    hold_max_requests: int = 256  # the gateway's hold queue (gateway/hold.py)
    hold_deadline_s: float = 60.0

    def __post_init__(self) -> None:
        if self.min_replicas < 0 or self.max_replicas < 0:
            raise ValueError("min_replicas, max_replicas: must be >= 0")
        if self.max_replicas and self.max_replicas < self.min_replicas:
            raise ValueError(
                f"max_replicas: {self.max_replicas} is below min_replicas {self.min_replicas}"
            )
        if self.queue_per_replica <= 0:
            raise ValueError("queue_per_replica: must be > 0")
        if not 0.0 < self.kv_low < self.kv_high <= 1.0:
            raise ValueError(f"kv_low < kv_high in (0, 1]: got {self.kv_low}, {self.kv_high}")
        for name in ("sleep_after_s", "ttft_slo_s", "scale_down_after_s", "up_cooldown_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0")
        if self.hold_max_requests < 0 or self.hold_deadline_s <= 0:
            raise ValueError("hold_max_requests >= 0 and hold_deadline_s > 0")
