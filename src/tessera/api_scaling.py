"""`spec.scaling` of a ServingDeployment manifest: replica autoscaling, sleep, scale to zero.

Types mirroring the CRD's `spec.scaling` (docs/scaling.md) and their parsing; `config()`
turns them into the autoscaler's `policy_config.AutoscaleConfig` (with the TTFT SLO of
`spec.slo`). Called by `tessera.api.parse_spec`; the autoscale loop (operator timer and
`tessera up`) and the gateway's hold settings read the result. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tessera import fields, policy_config

_D = policy_config.AutoscaleConfig()


@dataclass(frozen=True)
class ReplicaBounds:
    """`spec.scaling.replicas`: how many replicas stay awake."""

    min: int = _D.min_replicas  # 0 allows scale to zero
    max: int = _D.max_replicas  # 0: every planned replica


@dataclass(frozen=True)
class IdleSpec:
    """`spec.scaling.idle`: when an idle replica sleeps."""

    sleep_after_seconds: float = _D.sleep_after_s  # 0: never


@dataclass(frozen=True)
class SignalsSpec:
    """`spec.scaling.signals`: the thresholds of the serving signals."""

    queue_per_replica: float = _D.queue_per_replica
    kv_high: float = _D.kv_high
    kv_low: float = _D.kv_low
    scale_down_after_seconds: float = _D.scale_down_after_s
    up_cooldown_seconds: float = _D.up_cooldown_s


@dataclass(frozen=True)
class HoldSpec:
    """`spec.scaling.hold`: the gateway's queue while no replica is awake."""

    max_requests: int = _D.hold_max_requests
    deadline_seconds: float = _D.hold_deadline_s


@dataclass(frozen=True)
class ScalingSpec:
    enabled: bool = False
    replicas: ReplicaBounds = field(default_factory=ReplicaBounds)
    idle: IdleSpec = field(default_factory=IdleSpec)
    signals: SignalsSpec = field(default_factory=SignalsSpec)
    hold: HoldSpec = field(default_factory=HoldSpec)

    def config(self, ttft_slo_s: float = 0.0) -> policy_config.AutoscaleConfig:
        sig = self.signals
        return policy_config.AutoscaleConfig(
            enabled=self.enabled,
            min_replicas=self.replicas.min,
            max_replicas=self.replicas.max,
            sleep_after_s=self.idle.sleep_after_seconds,
            queue_per_replica=sig.queue_per_replica,
            kv_high=sig.kv_high,
            kv_low=sig.kv_low,
            ttft_slo_s=ttft_slo_s,
            scale_down_after_s=sig.scale_down_after_seconds,
            up_cooldown_s=sig.up_cooldown_seconds,
            hold_max_requests=self.hold.max_requests,
            hold_deadline_s=self.hold.deadline_seconds,
        )


def parse(doc: Any, path: str) -> ScalingSpec:
    """`spec.scaling`; raise `fields.FieldError` naming the first bad field."""
    s = fields.mapping(doc, path)
    fields.known_only(s, ("enabled", "replicas", "idle", "signals", "hold"), path)
    r = fields.mapping(fields.optional(s, "replicas", {}), f"{path}.replicas")
    fields.known_only(r, ("min", "max"), f"{path}.replicas")
    lo = fields.integer(
        fields.optional(r, "min", _D.min_replicas), f"{path}.replicas.min", minimum=0
    )
    hi = fields.integer(
        fields.optional(r, "max", _D.max_replicas), f"{path}.replicas.max", minimum=0
    )
    if hi and hi < lo:
        raise fields.FieldError(f"{path}.replicas.max", f"must be 0 or >= min ({lo}), got {hi}")
    i = fields.mapping(fields.optional(s, "idle", {}), f"{path}.idle")
    fields.known_only(i, ("sleepAfterSeconds",), f"{path}.idle")
    g = fields.mapping(fields.optional(s, "signals", {}), f"{path}.signals")
    keys = ("queuePerReplica", "kvHigh", "kvLow", "scaleDownAfterSeconds", "upCooldownSeconds")
    fields.known_only(g, keys, f"{path}.signals")
    d = SignalsSpec()
    num = {
        k: fields.number(fields.optional(g, k, v), f"{path}.signals.{k}", minimum=0.0)
        for k, v in zip(
            keys,
            (
                d.queue_per_replica,
                d.kv_high,
                d.kv_low,
                d.scale_down_after_seconds,
                d.up_cooldown_seconds,
            ),
            strict=True,
        )
    }
    if num["queuePerReplica"] <= 0:
        raise fields.FieldError(f"{path}.signals.queuePerReplica", "must be > 0")
    if not 0.0 < num["kvLow"] < num["kvHigh"] <= 1.0:
        raise fields.FieldError(
            f"{path}.signals.kvLow", f"must be > 0 and below kvHigh ({num['kvHigh']}) <= 1"
        )
    h = fields.mapping(fields.optional(s, "hold", {}), f"{path}.hold")
    fields.known_only(h, ("maxRequests", "deadlineSeconds"), f"{path}.hold")
    deadline = fields.number(
        fields.optional(h, "deadlineSeconds", _D.hold_deadline_s), f"{path}.hold.deadlineSeconds"
    )
    if deadline <= 0:
        raise fields.FieldError(f"{path}.hold.deadlineSeconds", "must be > 0")
    return ScalingSpec(
        enabled=fields.boolean(fields.optional(s, "enabled", False), f"{path}.enabled"),
        replicas=ReplicaBounds(lo, hi),
        idle=IdleSpec(
            fields.number(
                fields.optional(i, "sleepAfterSeconds", _D.sleep_after_s),
                f"{path}.idle.sleepAfterSeconds",
                minimum=0.0,
            )
        ),
        signals=SignalsSpec(*num.values()),
        hold=HoldSpec(
            fields.integer(
                fields.optional(h, "maxRequests", _D.hold_max_requests),
                f"{path}.hold.maxRequests",
                minimum=0,
            ),
            deadline,
        ),
    )
