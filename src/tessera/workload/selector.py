"""Pick the forecaster that did best on the recent validation window, span by span.

The loop must never be worse for having an LSTM: at each span every candidate's
one-step forecasts over the last ``window`` spans (all made before those spans were
seen) are scored by pooled RRMSE, and the next span's forecast comes from the best one
(ties: the earlier candidate in the given order, so put the cheapest first).
:func:`select_rolling` does this over precomputed rolling forecasts (the benchmark);
:class:`BestRecent` is the same rule as a ``Forecaster`` for the control loop, keeping
each candidate's past forecasts as it goes. Callers: ``tessera bench predictor`` and the
switching loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from tessera.workload import forecaster, rrmse

FloatArray = npt.NDArray[np.float64]
DEFAULT_WINDOW = 10


def _score(actual: FloatArray, predicted: FloatArray) -> float:
    value = rrmse.overall(actual, predicted)
    return float("inf") if np.isnan(value) else value


def select_rolling(
    predictions: Mapping[str, FloatArray],
    actual: FloatArray,
    start: int,
    window: int = DEFAULT_WINDOW,
) -> tuple[FloatArray, list[str]]:
    """Selected forecasts for rows ``start..`` of ``actual`` and the method chosen for each.

    ``predictions[name][i]`` is the one-step forecast of ``actual[i]``; rows before
    ``start`` are the first validation window (``start >= window``).
    """
    if window < 1 or start < window:
        raise ValueError(f"need window >= 1 and start >= window, got {window}, {start}")
    names = list(predictions)
    rows, chosen = [], []
    for t in range(start, len(actual)):
        scores = [_score(actual[t - window : t], predictions[n][t - window : t]) for n in names]
        best = names[int(np.argmin(scores))]
        chosen.append(best)
        rows.append(predictions[best][t])
    return np.asarray(rows, dtype=np.float64).reshape(-1, actual.shape[1]), chosen


@dataclasses.dataclass
class BestRecent:
    """A ``Forecaster`` that forwards to the candidate best over the last ``window`` spans."""

    candidates: dict[str, forecaster.Forecaster]
    window: int = DEFAULT_WINDOW
    chosen: str = ""  # the candidate that made the last forecast
    _past: dict[str, list[FloatArray]] = dataclasses.field(default_factory=dict)
    _seen: int = 0  # history length at the last predict

    def fit(self, history: FloatArray) -> None:
        """Fit every candidate; forget past forecasts."""
        for model in self.candidates.values():
            model.fit(history)
        self._past = {n: [] for n in self.candidates}
        self._seen = 0

    def predict(self, history: FloatArray) -> FloatArray:
        """Forecast with the recent best; histories must grow one span per call."""
        forecaster.check_history(history)
        if self._seen and len(history) != self._seen + 1:
            self._past = {n: [] for n in self.candidates}  # not consecutive: restart
        self._seen = len(history)
        window = min(self.window, *(len(p) for p in self._past.values()))
        names = list(self.candidates)
        if window >= 1:
            recent = history[-window:]
            scores = [_score(recent, np.asarray(self._past[n][-window:])) for n in names]
            self.chosen = names[int(np.argmin(scores))]
        else:
            self.chosen = names[0]
        forecasts = {n: self.candidates[n].predict(history) for n in names}
        for n in names:
            self._past[n].append(forecasts[n])
        return forecasts[self.chosen]
