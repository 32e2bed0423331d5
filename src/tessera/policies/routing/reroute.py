"""Whether a within-span re-route may move the class split: only on evidence of a new mix.

Inputs: the class mixes the span's routing was planned for (the forecast and the last span
as observed, req/s or counts per class) and the arrivals counted per class since the span
began. A chi-square goodness-of-fit test (`scipy.stats.chisquare`) of the counts against
each planned mix's shares; the split moves only when every planned mix is rejected at
`ALPHA` per span (Bonferroni over the span's reads). Counts too few for the test (an
expected count under `MIN_EXPECTED`, Cochran's rule) never move it. Pure; called by the
simulated switching loop
(`tessera.sim.oserve_switcher.Switcher._reroute`) at each within-span counter read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats

ALPHA = 0.01  # significance: a mix the counts reject at 1 % is a different mix
MIN_EXPECTED = 5.0  # Cochran's rule: the chi-square approximation needs >= 5 expected per cell


@dataclass(frozen=True)
class RerouteDecision:
    """Move the split (`reroute`) or keep it; the largest p-value over the planned mixes
    (the plan the counts fit best) and why."""

    reroute: bool
    p_value: float
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"reroute": self.reroute, "p_value": round(self.p_value, 6), "reason": self.reason}


def fit(planned: Sequence[float], counts: Sequence[float]) -> float | None:
    """The p-value of `counts` drawn from `planned`'s shares (chi-square; a count in a
    class the plan gives no share is a different mix, p = 0). None when the counts are
    too few for the test."""
    if len(planned) != len(counts):
        raise ValueError("planned mix and counts differ in classes")
    total_plan, n = float(sum(planned)), float(sum(counts))
    if total_plan <= 0 or n <= 0:
        return None
    obs, exp = [], []
    for p, c in zip(planned, counts, strict=True):
        if p < 0 or c < 0:
            raise ValueError("negative rate or count")
        if p == 0:
            if c > 0:
                return 0.0
            continue
        obs.append(float(c))
        exp.append(n * p / total_plan)
    if len(exp) < 2:
        return 1.0  # one class: every count fits it
    if min(exp) < MIN_EXPECTED:
        return None
    p_value = float(stats.chisquare(obs, exp).pvalue)
    return p_value if math.isfinite(p_value) else 0.0


def decide(
    planned: Sequence[Sequence[float]],
    counts: Sequence[float],
    alpha: float = ALPHA,
    reads: int = 1,
) -> RerouteDecision:
    """Re-route only when the counts since the span began reject every mix the span's
    routing was planned for. `alpha` is the span's chance of a move on counts from a
    planned mix over its `reads` counter reads: each read tests at `alpha / reads`
    (Bonferroni)."""
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    if reads < 1:
        raise ValueError("reads must be >= 1")
    alpha /= reads
    if not planned:
        return RerouteDecision(True, 0.0, "no planned mix: route for the counts")
    fits = [fit(p, counts) for p in planned]
    if any(f is None for f in fits):
        return RerouteDecision(False, 1.0, f"too few arrivals ({sum(counts):g}) to test the mix")
    best = max(f for f in fits if f is not None)
    if best >= alpha:
        return RerouteDecision(False, best, f"counts fit a planned mix (p={best:.3g} >= {alpha:g})")
    return RerouteDecision(
        True, best, f"counts reject every planned mix (p={best:.3g} < {alpha:g})"
    )
