"""`spec.policies` of a ServingDeployment manifest: its types and their parsing.

The elastic policies' switches and knobs (switching: docs/switching.md; overload:
docs/overload.md; scaling: docs/module-scaling.md), parsed from the manifest into the
policies' config types (`policy_config`). Called by `tessera.api.parse_spec`; pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tessera import fields, policy_config

SWITCHING_MODES = ("advisory", "active")


@dataclass(frozen=True)
class SwitchingSpec:
    """`spec.policies.switching`: workload-adaptive switching (docs/switching.md)."""

    enabled: bool = False
    mode: str = "advisory"  # advisory: report only; active: switch
    span_seconds: float = 60.0  # forecast / re-plan period
    min_gain: float = 0.1  # switch only to a deployment modelled >= 1 + minGain times faster


@dataclass(frozen=True)
class PoliciesSpec:
    switching: SwitchingSpec = SwitchingSpec()
    overload: policy_config.OverloadConfig = field(default_factory=policy_config.OverloadConfig)
    scaling: policy_config.ScalingConfig = field(default_factory=policy_config.ScalingConfig)


def parse(doc: Any, path: str) -> PoliciesSpec:
    """`spec.policies`; raise `fields.FieldError` naming the first bad field."""
    p = fields.mapping(doc, path)
    fields.known_only(p, ("switching", "overload", "scaling"), path)
    return PoliciesSpec(
        switching=_switching(fields.optional(p, "switching", {}), f"{path}.switching"),
        overload=_overload(fields.optional(p, "overload", {}), f"{path}.overload"),
        scaling=_scaling(fields.optional(p, "scaling", {}), f"{path}.scaling"),
    )


def _switching(doc: Any, path: str) -> SwitchingSpec:
    """`spec.policies.switching` (OServe; defaults and meaning in docs/switching.md)."""
    s = fields.mapping(doc, path)
    fields.known_only(s, ("enabled", "mode", "spanSeconds", "minGain"), path)
    return SwitchingSpec(
        enabled=fields.boolean(fields.optional(s, "enabled", False), f"{path}.enabled"),
        mode=fields.string(
            fields.optional(s, "mode", "advisory"), f"{path}.mode", choices=SWITCHING_MODES
        ),
        span_seconds=fields.number(
            fields.optional(s, "spanSeconds", 60.0), f"{path}.spanSeconds", minimum=1.0
        ),
        min_gain=fields.number(fields.optional(s, "minGain", 0.1), f"{path}.minGain", minimum=0.0),
    )


def _overload(doc: Any, path: str) -> policy_config.OverloadConfig:
    """`spec.policies.overload` (KunServe; defaults and meaning in docs/overload.md)."""
    o = fields.mapping(doc, path)
    fields.known_only(o, ("enabled", "dropThreshold", "restoreThreshold"), path)
    d = policy_config.OverloadConfig()
    drop = fields.number(
        fields.optional(o, "dropThreshold", d.drop_threshold), f"{path}.dropThreshold"
    )
    restore = fields.number(
        fields.optional(o, "restoreThreshold", d.restore_threshold), f"{path}.restoreThreshold"
    )
    if not 0.0 < drop <= 1.0:
        raise fields.FieldError(f"{path}.dropThreshold", f"must be in (0, 1], got {drop}")
    if not 0.0 < restore < drop:
        raise fields.FieldError(
            f"{path}.restoreThreshold",
            f"must be > 0 and below dropThreshold ({drop}), got {restore}",
        )
    return policy_config.OverloadConfig(
        fields.boolean(fields.optional(o, "enabled", False), f"{path}.enabled"), drop, restore
    )


def _scaling(doc: Any, path: str) -> policy_config.ScalingConfig:
    """`spec.policies.scaling` (CoCoServe; defaults and meaning in docs/module-scaling.md)."""
    keys = (
        "enabled", "upIdleFraction", "downViolationRate", "batchStep", "maxMigrations",
        "evictAfterSeconds",
    )  # fmt: skip
    sc = fields.mapping(doc, path)
    fields.known_only(sc, keys, path)
    d = policy_config.ScalingConfig()
    fractions = {}
    for key, default in (
        ("upIdleFraction", d.up_idle_fraction),
        ("downViolationRate", d.down_violation_rate),
    ):
        v = fields.number(fields.optional(sc, key, default), f"{path}.{key}", minimum=0.0)
        if v >= 1.0:
            raise fields.FieldError(f"{path}.{key}", f"must be a fraction in [0, 1), got {v}")
        fractions[key] = v
    return policy_config.ScalingConfig(
        fields.boolean(fields.optional(sc, "enabled", False), f"{path}.enabled"),
        fractions["upIdleFraction"],
        fractions["downViolationRate"],
        fields.integer(
            fields.optional(sc, "batchStep", d.batch_step), f"{path}.batchStep", minimum=1
        ),
        fields.integer(
            fields.optional(sc, "maxMigrations", d.max_migrations),
            f"{path}.maxMigrations",
            minimum=0,
        ),
        fields.number(
            fields.optional(sc, "evictAfterSeconds", d.evict_after_seconds),
            f"{path}.evictAfterSeconds",
            positive=True,
        ),
    )
