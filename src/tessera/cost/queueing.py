"""Queueing approximations for tail latency: Erlang C waits and mixture quantiles.

Pure math, no model knowledge; ``tessera.planner.latency`` uses it to turn a replica's load
into P99 TTFT and end-to-end latency (docs/switching.md, "Latency-aware objective"). Slot
wait (M/M/c): 0 with probability ``1 - C`` (Erlang C), else exponential at rate
``theta = c*mu - lam``. Prefill wait (M/M/1 on the bottleneck stage): 0 with probability
``1 - u``, else exponential at rate ``(1 - u) / p``. Non-exponential service
(Allen-Cunneen) scales waits by ``(1 + scv) / 2`` (``scv = 0``: M/D/c, half the wait).
:func:`stretch`: the compound-Poisson spread of prefills stalling a request's decode, as a
shifted exponential of the same mean and variance. A wait is an :class:`AtomExp` (atom at
0 plus an exponential tail); :func:`survival` sums up to three in closed form, and
:func:`mixture_quantile` bisects a mixture's summed survival for a percentile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tessera import fields


@dataclass(frozen=True)
class AtomExp:
    """A wait: 0 with probability ``1 - p``, else Exp(``rate``)."""

    p: float
    rate: float  # 1/s; inf with p = 0 means no wait

    def __post_init__(self) -> None:
        if not 0 <= self.p <= 1:
            raise fields.FieldError("p", f"must be in [0, 1], got {self.p}")
        if not self.rate > 0:
            raise fields.FieldError("rate", "must be > 0")

    @property
    def mean(self) -> float:
        """Mean wait."""
        return 0.0 if self.p == 0 else self.p / self.rate


NO_WAIT = AtomExp(0.0, math.inf)


def scaled(wait: AtomExp, factor: float) -> AtomExp:
    """The wait multiplied by ``factor`` > 0 (its exponential rate divided by it)."""
    return wait if wait.p == 0 else AtomExp(wait.p, wait.rate / factor)


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in M/M/c with ``offered = lam / mu`` < servers."""
    if servers < 1:
        raise fields.FieldError("servers", "must be >= 1")
    if not 0 <= offered < servers:
        raise fields.FieldError("offered", f"must be in [0, {servers}), got {offered}")
    b = 1.0  # Erlang B by the stable recursion
    for n in range(1, servers + 1):
        b = offered * b / (n + offered * b)
    return servers * b / (servers - offered * (1 - b))


def slot_wait(servers: int, lam: float, mu: float, scv: float = 1.0) -> AtomExp:
    """M/M/c (or Allen-Cunneen M/G/c) wait for one of ``servers`` slots."""
    if lam <= 0:
        return NO_WAIT
    offered = lam / mu
    p = erlang_c(servers, offered)
    rate = (servers * mu - lam) / max(1e-12, (1 + scv) / 2)
    return AtomExp(p, rate) if p > 0 else NO_WAIT


def single_wait(utilization: float, mean_service: float, scv: float = 1.0) -> AtomExp:
    """M/M/1 (or M/G/1 scaled) wait behind ``utilization`` of one server."""
    if utilization <= 0 or mean_service <= 0:
        return NO_WAIT
    if utilization >= 1:
        raise fields.FieldError("utilization", f"must be < 1, got {utilization}")
    rate = (1 - utilization) / mean_service / max(1e-12, (1 + scv) / 2)
    return AtomExp(utilization, rate)


def stretch(interrupt_rate: float, decode_s: float, prefill_share: float) -> tuple[float, AtomExp]:
    """The spread of a decode of mean ``decode_s`` stalled by prefills, as ``(shift, wait)``.

    The prefill time landing inside the decode is compound Poisson: variance
    ``interrupt_rate * decode_s`` (``interrupt_rate = sum_k x_k P_k**2``, s²/s). Each extra
    second of prefill stalls the decode and lets more prefills in, so the decode's
    deviation is the prefill's over ``1 - prefill_share``. Returned as an exponential
    wait of mean ``sd`` and a shift of ``-sd`` to the fixed part: mean kept, variance
    matched, a right-skewed tail (a few long prompts make the spread)."""
    if interrupt_rate <= 0 or decode_s <= 0 or not 0 <= prefill_share < 1:
        return 0.0, NO_WAIT
    sd = math.sqrt(interrupt_rate * decode_s) / (1 - prefill_share)
    return -sd, AtomExp(1.0, 1 / sd)


def _hypoexp_tail(rates: Sequence[float], t: float) -> float:
    """P(sum of independent Exp(rates) > t), distinct rates nudged apart when equal."""
    if not rates:
        return 0.0
    if len(rates) == 1:
        return math.exp(-rates[0] * t)
    rs: list[float] = []
    for r in sorted(rates):
        # equal rates make the closed form divide by 0: separate them by 1e-4 (relative)
        rs.append(max(r, rs[-1] * (1 + 1e-4)) if rs else r)
    out = 0.0
    for i, ri in enumerate(rs):
        coef = 1.0
        for j, rj in enumerate(rs):
            if j != i:
                coef *= rj / (rj - ri)
        out += coef * math.exp(-ri * t)
    return min(1.0, max(0.0, out))


def survival(t: float, a: AtomExp, b: AtomExp = NO_WAIT, c: AtomExp = NO_WAIT) -> float:
    """P(A + B + C > t) for independent waits ``a``, ``b`` and ``c``."""
    if t < 0:
        return 1.0
    if c.p == 0:
        return _survival2(t, a, b)
    waits = [w for w in (a, b, c) if w.p > 0]
    total = 0.0
    for mask in range(1 << len(waits)):
        prob, rates = 1.0, []
        for i, w in enumerate(waits):
            if mask >> i & 1:
                prob *= w.p
                rates.append(w.rate)
            else:
                prob *= 1 - w.p
        if prob > 0 and rates:
            total += prob * _hypoexp_tail(rates, t)
    return total


def _survival2(t: float, a: AtomExp, b: AtomExp) -> float:
    if t < 0:
        return 1.0

    def tail(rate: float) -> float:
        return math.exp(-rate * t) if math.isfinite(rate) else 0.0

    both = 0.0
    if a.p > 0 and b.p > 0:
        x, y = a.rate, b.rate
        if abs(x - y) <= 1e-9 * max(x, y):
            both = (1 + x * t) * math.exp(-x * t)
        else:
            both = (y * math.exp(-x * t) - x * math.exp(-y * t)) / (y - x)
    return a.p * (1 - b.p) * tail(a.rate) + b.p * (1 - a.p) * tail(b.rate) + a.p * b.p * both


@dataclass(frozen=True)
class Component:
    """One part of a latency mixture: a fixed latency plus a sum of up to three waits."""

    weight: float  # share of requests
    base: float  # seconds without waiting
    wait: AtomExp = NO_WAIT
    wait2: AtomExp = NO_WAIT
    wait3: AtomExp = NO_WAIT  # the decode's stretch (`stretch`)


def mixture_quantile(components: Sequence[Component], q: float = 0.99) -> float:
    """The ``q`` quantile of a weighted mixture of ``base + waits`` (bisection)."""
    total = sum(c.weight for c in components)
    if total <= 0:
        return 0.0
    target = (1 - q) * total

    def excess(x: float) -> float:
        return sum(c.weight * survival(x - c.base, c.wait, c.wait2, c.wait3) for c in components)

    lo = min(c.base for c in components)
    hi = max(c.base for c in components) + 1.0
    while excess(hi) > target:
        hi = lo + 2 * (hi - lo)
        if hi > 1e9:
            return math.inf
    for _ in range(100):
        mid = (lo + hi) / 2
        if excess(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi
