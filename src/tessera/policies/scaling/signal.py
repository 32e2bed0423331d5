"""When the periodic module-scaling loop scales up, scales down or lifts a batch cut.

Inputs: the gateway's cumulative inter-token latency histogram
(`tessera_gateway_inter_token_latency_seconds`) at the previous tick and now, the TPOT target
(`spec.slo.tpotP99Ms`) and `spec.policies.scaling`. The window's violation rate is its share of
gaps above the target (interpolated inside a bucket as `histogram_quantile` does; above the
largest finite bound counts late); its mean gap is the step time Algorithm 2 compares. `decide`:
"up" with a target, at least `min_gaps` gaps and the rate above `downViolationRate`; in a calm
window (rate at most half the threshold), "restore" while a batch cut is in force, then "evict"
once replicas are placed and calm has lasted `evictAfterSeconds` (`calm_for`); else "hold". So
the loop does not flap. Caller: `tessera.control.scaling_loop.ScalingLoop`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tessera.policies.scaling import module_scaling as ms


@dataclass(frozen=True)
class Hist:
    """A cumulative histogram: `counts[i]` observations <= `bounds[i]` (the last bound
    may be +inf), `total` observations in all, `sum_s` their sum in seconds."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    total: float
    sum_s: float

    def __post_init__(self) -> None:
        if len(self.bounds) != len(self.counts):
            raise ValueError("bounds and counts: must have the same length")


@dataclass(frozen=True)
class Window:
    gaps: float  # inter-token gaps observed in the window
    late: float  # of which above the target (interpolated)
    mean_s: float  # mean gap: the observed seconds per decode step

    @property
    def violation_rate(self) -> float:
        return self.late / self.gaps if self.gaps > 0 else 0.0


def from_samples(samples: Iterable[Any]) -> Hist:
    """A cumulative `Hist` from one Prometheus histogram's samples (objects with `name`,
    `labels` and `value`, as `prometheus_client` gives them, collected or parsed)."""
    bounds: list[float] = []
    counts: list[float] = []
    total = sum_s = 0.0
    for s in samples:
        if s.name.endswith("_bucket"):
            bounds.append(float(s.labels["le"]))
            counts.append(float(s.value))
        elif s.name.endswith("_count"):
            total = float(s.value)
        elif s.name.endswith("_sum"):
            sum_s = float(s.value)
    return Hist(tuple(bounds), tuple(counts), total, sum_s)


def _on_time(h: Hist, target_s: float) -> float:
    """Observations <= target_s, interpolating inside the bucket holding it."""
    lo_bound, lo_count = 0.0, 0.0
    for b, c in zip(h.bounds, h.counts, strict=True):
        if math.isinf(b):
            return lo_count  # above the largest finite bound: late
        if target_s <= b:
            return lo_count + (c - lo_count) * (target_s - lo_bound) / (b - lo_bound)
        lo_bound, lo_count = b, c
    return lo_count


def window(prev: Hist | None, now: Hist, target_s: float) -> Window:
    """The gaps observed between `prev` (None: since the start) and `now`."""
    if prev is not None and prev.bounds != now.bounds:
        raise ValueError("histograms: bucket bounds differ")
    gaps = now.total - (prev.total if prev else 0.0)
    if gaps <= 0:
        return Window(0.0, 0.0, 0.0)
    mean = (now.sum_s - (prev.sum_s if prev else 0.0)) / gaps
    if target_s <= 0:
        return Window(gaps, 0.0, mean)
    on_time = _on_time(now, target_s) - (_on_time(prev, target_s) if prev else 0.0)
    return Window(gaps, max(0.0, gaps - on_time), mean)


def calm(w: Window, cfg: ms.ScalingConfig) -> bool:
    """The window shows no violation: at most half `downViolationRate` of its gaps late
    (no gaps at all: no load, so nothing is late). Between half the threshold and the
    threshold a window is neither calm nor violating (hysteresis)."""
    return w.violation_rate <= cfg.down_violation_rate / 2


def calm_for(prev_s: float, w: Window, cfg: ms.ScalingConfig, elapsed_s: float) -> float:
    """Seconds the violation has been absent after a window of `elapsed_s` seconds:
    `prev_s` grown by the window when it is calm, 0 when it is not."""
    return prev_s + max(0.0, elapsed_s) if calm(w, cfg) else 0.0


@dataclass(frozen=True)
class Decision:
    kind: str  # "none" | "up" | "restore" | "evict" | "hold"
    reason: str


def decide(
    w: Window,
    cfg: ms.ScalingConfig,
    target_s: float,
    batch_capped: bool,
    min_gaps: int = 8,
    calm_s: float = 0.0,
    replicated: bool = False,
) -> Decision:
    """What the loop does this tick (module docstring). `calm_s`: seconds the violation
    has been absent (`calm_for`); `replicated`: some layer replica is placed."""
    if not cfg.enabled:
        return Decision("none", "spec.policies.scaling.enabled is false")
    rate = w.violation_rate
    if target_s > 0 and w.gaps >= min_gaps and rate > cfg.down_violation_rate:
        return Decision(
            "up",
            f"{rate:.1%} of {w.gaps:.0f} inter-token gaps over {target_s * 1e3:.0f} ms "
            f"> downViolationRate {cfg.down_violation_rate:.1%}",
        )
    if batch_capped and calm(w, cfg):
        return Decision("restore", f"violation rate {rate:.1%}: lift the batch cut")
    if replicated and calm(w, cfg) and calm_s >= cfg.evict_after_seconds:
        return Decision(
            "evict",
            f"no violation for {calm_s:.0f} s >= evictAfterSeconds {cfg.evict_after_seconds:g}",
        )
    return Decision("hold", f"violation rate {rate:.1%}: nothing to change")
