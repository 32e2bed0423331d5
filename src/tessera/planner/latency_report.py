"""What the latency model reports: a layout's modelled tail latency at a demand, and one
routing priced at several demands.

`LatencyReport` holds P99 request latency, normalized latency, TTFT and TPOT, the highest
utilization, whether the SLO is met and the routed rates; `Robust` is a routing (a split of
each class over the replica groups) priced at the forecast and the last span's mix, its
price being the worse. `weighted_quantile` reads a P99 from the demand-weighted mixture.
Every figure is model output, not a measurement. Made by `planner.latency.LatencyModel`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera.planner.shapes import Shape

Q = 0.99


@dataclass(frozen=True)
class LatencyReport:
    """Modelled tail latency of a layout at a demand."""

    p99_latency_s: float  # end-to-end request latency
    p99_normalized_s: float  # request latency / output tokens (vLLM's normalized latency)
    p99_ttft_s: float
    p99_tpot_s: float
    max_utilization: float
    meets_slo: bool  # P99 TTFT and TPOT within the problem's SLO
    rates: tuple[tuple[float, ...], ...]  # [group][class] req/s routed (all replicas)
    dedicated: str = ""  # replicas set apart for one class, e.g. "1x tp4pp2: LISO"
    groups: tuple[tuple[Shape, int], ...] = ()  # (shape, replicas) per row of ``rates``

    def key(self) -> tuple[bool, float]:
        """Sort key: SLO-meeting first, then lower P99 latency."""
        return (not self.meets_slo, self.p99_latency_s)


INFEASIBLE = LatencyReport(math.inf, math.inf, math.inf, math.inf, math.inf, False, ())


@dataclass(frozen=True)
class Robust:
    """One routing (one split of each class over the groups) priced at several demands."""

    demands: tuple[tuple[float, ...], ...]
    at: tuple[LatencyReport, ...]  # [demand] the routing's report there
    worst: LatencyReport  # the worst of ``at`` (the routing's price)
    split: tuple[tuple[float, ...], ...] = ()  # [group of worst.groups][class] share

    def rates(self) -> tuple[tuple[float, ...], ...]:
        """[group][class] the split at each class's highest rate among ``demands`` (a
        gateway's per-class shares, in req/s like `LatencyReport.rates`)."""
        top = [max(d[j] for d in self.demands) for j in range(len(self.demands[0]))]
        return tuple(tuple(w * t for w, t in zip(row, top, strict=True)) for row in self.split)

    def at_demand(self, demand: tuple[float, ...]) -> LatencyReport:
        """The report at one of ``demands``."""
        return self.at[self.demands.index(tuple(float(v) for v in demand))]


def weighted_quantile(pairs: list[tuple[float, float]], q: float) -> float:
    """The `q` quantile of a mixture given as (weight, value) pairs."""
    ordered = sorted(pairs, key=lambda p: p[1])
    total = sum(w for w, _ in ordered)
    acc = 0.0
    for w, v in ordered:
        acc += w
        if acc >= q * total - 1e-12:
            return v
    return ordered[-1][1] if ordered else 0.0
