"""Baseline forecasters: last value, moving average, exponential smoothing, seasonal, the
mean of the spans since the mix last changed (per class).

Callers: the predictor benchmark (as the bar the LSTM must clear) and the planner's
control loop (a cheap forecaster needing no torch). Each implements
`forecaster.Forecaster`. A hyperparameter left as None is chosen in ``fit`` — on the
history given to ``fit`` only (the training split), by the lowest pooled RRMSE of the
one-step-ahead predictions over that history — so the test split never tunes anything.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt
from scipy import stats

from tessera.workload import forecaster, rrmse

WINDOWS = (1, 2, 3, 5, 8, 12, 20, 30, 50)  # moving-average windows tried by fit
ALPHAS = tuple(round(0.05 * i, 2) for i in range(1, 21))  # smoothing factors tried by fit
PERIODS = (2, 3, 4, 6, 8, 12, 18, 24, 30, 36, 60, 90, 120, 180, 360)  # seasonal periods tried
CYCLES = (1, 2, 3)  # seasonal cycles averaged
# RegimeMean: a span is the same regime when its counts fit the later spans' mean at this
# significance (as the within-span re-route's test, policies.routing.reroute), on classes
# expecting at least Cochran's 5 arrivals
REGIME_ALPHA = 0.01
REGIME_MIN_EXPECTED = 5.0

FloatArray = npt.NDArray[np.float64]


@dataclasses.dataclass
class LastValue:
    """Predicts that the next span repeats the last one."""

    def fit(self, history: FloatArray) -> None:
        """Nothing to learn."""
        forecaster.check_history(history)

    def predict(self, history: FloatArray) -> FloatArray:
        """The last row of `history`."""
        forecaster.check_history(history)
        return np.asarray(history[-1], dtype=np.float64).copy()


@dataclasses.dataclass
class MovingAverage:
    """Predicts the mean of the last `window` spans (fewer while history is shorter)."""

    window: int | None = None  # None: chosen from WINDOWS by fit

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be at least 1, got {self.window}")

    def fit(self, history: FloatArray) -> None:
        """Choose `window` on `history` when it was left as None."""
        forecaster.check_history(history)
        if self.window is None and len(history) >= 2:
            self.window = min(
                WINDOWS, key=lambda w: rrmse.overall(history[1:], _moving_average(history, w))
            )

    def predict(self, history: FloatArray) -> FloatArray:
        """Mean of the last `window` rows of `history`."""
        forecaster.check_history(history)
        window = self.window if self.window is not None else 1
        return np.asarray(history[-window:].mean(axis=0), dtype=np.float64)


@dataclasses.dataclass
class ExpSmoothing:
    """Simple exponential smoothing: level ← α·count + (1 − α)·level, started at span 0."""

    alpha: float | None = None  # None: chosen from ALPHAS by fit

    def __post_init__(self) -> None:
        if self.alpha is not None and not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")

    def fit(self, history: FloatArray) -> None:
        """Choose `alpha` on `history` when it was left as None."""
        forecaster.check_history(history)
        if self.alpha is None and len(history) >= 2:
            self.alpha = min(
                ALPHAS, key=lambda a: rrmse.overall(history[1:], _smoothed(history, a)[:-1])
            )

    def predict(self, history: FloatArray) -> FloatArray:
        """The smoothed level after the whole of `history`."""
        forecaster.check_history(history)
        alpha = self.alpha if self.alpha is not None else 1.0
        return np.asarray(_smoothed(history, alpha)[-1], dtype=np.float64)


def _moving_average(history: FloatArray, window: int) -> FloatArray:
    """Row t-1 is the mean of rows max(0, t − window)..t−1, for t = 1..len − 1."""
    csum = np.vstack([np.zeros((1, history.shape[1])), np.cumsum(history, axis=0)])
    ends = np.arange(1, len(history))
    starts = np.maximum(0, ends - window)
    return np.asarray((csum[ends] - csum[starts]) / (ends - starts)[:, None], dtype=np.float64)


def _smoothed(history: FloatArray, alpha: float) -> FloatArray:
    """Row t is the level after rows 0..t (so it predicts row t + 1)."""
    levels = np.empty_like(history, dtype=np.float64)
    level = np.asarray(history[0], dtype=np.float64)
    levels[0] = level
    for t in range(1, len(history)):
        level = alpha * history[t] + (1 - alpha) * level
        levels[t] = level
    return levels


@dataclasses.dataclass
class Seasonal:
    """Seasonal naive: the mean of the spans one, two, ... ``cycles`` periods back.

    With ``period`` spans per cycle, span t is predicted by the mean of rows t − period,
    t − 2·period, … (the cycles available). ``period`` and ``cycles`` left as None are
    chosen on the history given to ``fit`` (periods up to a third of it) by pooled RRMSE.
    Until a whole period is seen it predicts the last value.
    """

    period: int | None = None
    cycles: int | None = None

    def __post_init__(self) -> None:
        if self.period is not None and self.period < 1:
            raise ValueError(f"period must be at least 1, got {self.period}")
        if self.cycles is not None and self.cycles < 1:
            raise ValueError(f"cycles must be at least 1, got {self.cycles}")

    def fit(self, history: FloatArray) -> None:
        """Choose `period` and `cycles` on `history` when left as None."""
        forecaster.check_history(history)
        periods = (
            [p for p in PERIODS if 3 * p <= len(history)] if self.period is None else [self.period]
        )
        cycles = list(CYCLES) if self.cycles is None else [self.cycles]
        if not periods:
            self.period = self.period or 1
            self.cycles = self.cycles or 1
            return
        best = min(
            ((p, c) for p in periods for c in cycles),
            key=lambda pc: rrmse.overall(history[pc[0] :], _seasonal(history, *pc)),
        )
        self.period, self.cycles = best

    def predict(self, history: FloatArray) -> FloatArray:
        """Mean of the rows whole periods before the next span."""
        forecaster.check_history(history)
        period, cycles = self.period or 1, self.cycles or 1
        t = len(history)
        rows = [t - n * period for n in range(1, cycles + 1) if t - n * period >= 0]
        if not rows:
            return np.asarray(history[-1], dtype=np.float64).copy()
        return np.asarray(history[rows].mean(axis=0), dtype=np.float64)


def _seasonal(history: FloatArray, period: int, cycles: int) -> FloatArray:
    """Row j predicts row period + j from the rows whole periods before it."""
    out = np.zeros_like(history[period:], dtype=np.float64)
    used = np.zeros(len(out))
    for n in range(1, cycles + 1):
        lag = n * period
        # targets t >= lag have the lagged row t - lag
        first = lag - period  # index into out of target t = lag
        if first >= len(out):
            break
        out[first:] += history[: len(history) - lag]
        used[first:] += 1
    return np.asarray(out / used[:, None], dtype=np.float64)


@dataclasses.dataclass
class RegimeMean:
    """Predicts the mean of the spans since the counts last changed: walking back from the
    last span, a span joins while its per-class counts fit the mean of the spans after it
    (each class a Poisson count: chi-square with one degree of freedom per class tested,
    at ``REGIME_ALPHA``). A steady mix is estimated from every span since it began, not
    one span's counts; right after a change it is the last span alone. History rows are
    per-span arrival counts."""

    def fit(self, history: FloatArray) -> None:
        """Nothing to learn."""
        forecaster.check_history(history)

    def predict(self, history: FloatArray) -> FloatArray:
        """Mean of the rows of the current regime."""
        forecaster.check_history(history)
        h = np.asarray(history, dtype=np.float64)
        start = len(h) - 1
        while start > 0 and same_regime(h[start - 1], h[start:].mean(axis=0)):
            start -= 1
        return np.asarray(h[start:].mean(axis=0), dtype=np.float64)


def same_regime(counts: FloatArray, expected: FloatArray) -> bool:
    """Whether one span's per-class `counts` fit Poisson counts of mean `expected` (a
    chi-square test over the classes where either reaches ``REGIME_MIN_EXPECTED``, a count
    where none is expected rejecting; with no such class, too few to tell: the same
    regime)."""
    c = np.asarray(counts, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    keep = np.maximum(c, e) >= REGIME_MIN_EXPECTED
    if not keep.any():
        return True
    if (e[keep] <= 0).any():
        return False
    x2 = float((((c - e) ** 2)[keep] / e[keep]).sum())
    return float(stats.chi2.sf(x2, int(keep.sum()))) >= REGIME_ALPHA
