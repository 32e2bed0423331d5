"""The `Forecaster` protocol and the one-step-ahead rolling evaluation every model shares.

Callers: the planner's control loop (``fit`` once on past counts, then ``predict`` each
span with all history seen so far) and the predictor benchmark (``split`` and ``rolling``).
A forecaster sees a (spans × classes) float count matrix, as built by ``counts``, and
returns the next span's per-class counts.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import numpy.typing as npt

TRAIN_FRACTION = 0.9  # the first 90 % of spans train, the last 10 % test

FloatArray = npt.NDArray[np.float64]


class Forecaster(Protocol):
    """Predicts the next span's arrivals per class from the history of counts."""

    def fit(self, history: FloatArray) -> None:
        """Learn from `history` (spans × classes); choose any hyperparameter here only."""

    def predict(self, history: FloatArray) -> FloatArray:
        """Counts (classes,) expected in the span right after `history`; never negative."""
        ...


def split(num_spans: int, train_fraction: float = TRAIN_FRACTION) -> int:
    """Index of the first test span: spans [0, i) train, [i, num_spans) test."""
    if not 0 < train_fraction < 1:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    i = math.floor(num_spans * train_fraction)
    if i < 1 or i >= num_spans:
        raise ValueError(f"{num_spans} spans cannot be split into train and test")
    return i


def rolling(forecaster: Forecaster, counts: FloatArray, start: int) -> FloatArray:
    """One-step-ahead predictions for spans start..end, each from ``counts[:t]``.

    Row j predicts ``counts[start + j]`` having seen the actual history up to it.
    """
    if not 1 <= start <= len(counts):
        raise ValueError(f"start {start} outside [1, {len(counts)}]")
    rows = [forecaster.predict(counts[:t]) for t in range(start, len(counts))]
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), counts.shape[1])


def check_history(history: FloatArray) -> None:
    """Raise ValueError unless `history` is a non-empty (spans × classes) matrix."""
    if history.ndim != 2 or history.shape[0] < 1 or history.shape[1] < 1:
        raise ValueError(
            f"history must be a non-empty (spans, classes) matrix, got {history.shape}"
        )
