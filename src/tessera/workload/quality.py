"""Forecast quality on held-out time: every method per class, and the recent-best selector.

For one span length: the spans are split into fit ``[0, v0)``, validation
``[v0, test0)`` and test ``[test0, end)`` (test = the last ``1 - train_fraction``;
validation = the ``validation_spans`` before it). Every method is fit on the fit spans
only, then forecasts each later span one step ahead from the actual history before it.
Methods are scored by RRMSE (``tessera.workload.rrmse``) on the test spans, per class
and pooled; the selector (``tessera.workload.selector``) picks, for each test span, the
method with the lowest RRMSE over the ``validation_spans`` spans before it, so every
choice uses only forecasts made before the spans they are scored on. Called by
``tessera bench predictor`` (once at the bench span, once at the planner's span).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tessera.workload import baselines, classes, counts, forecaster, rrmse, selector, traces

FloatArray = npt.NDArray[np.float64]
METHODS = ("last_value", "moving_average", "exp_smoothing", "seasonal", "lstm")

LstmFactory = Callable[[int], forecaster.Forecaster]  # window -> an unfitted LSTM


def _num(x: float) -> float | None:
    return None if math.isnan(x) else round(float(x), 4)


def evaluate(
    requests: Sequence[traces.Request],
    span_s: float,
    k: int | None,
    seed: int,
    lstm: LstmFactory | None,
    lstm_window: int,
    train_fraction: float = forecaster.TRAIN_FRACTION,
    validation_spans: int = selector.DEFAULT_WINDOW,
) -> dict[str, Any]:
    """The quality report at ``span_s`` (module docstring); the LSTM window shrinks to a
    third of the fit spans when those are few, and the LSTM is skipped below 2."""
    num_spans = counts.complete_spans(requests[-1].timestamp, span_s)
    test0 = forecaster.split(num_spans, train_fraction)
    v0 = test0 - validation_spans
    if v0 < 3:
        raise ValueError(
            f"{num_spans} spans of {span_s:g} s leave {v0} fit spans before the "
            f"{validation_spans}-span validation window; use shorter spans"
        )
    fit_requests = [r for r in requests if r.timestamp < v0 * span_s]
    workload = classes.fit_classes(fit_requests, k=k, seed=seed)
    matrix = counts.class_counts(requests, workload, span_s, num_spans)
    models: dict[str, forecaster.Forecaster] = {
        "last_value": baselines.LastValue(),
        "moving_average": baselines.MovingAverage(),
        "exp_smoothing": baselines.ExpSmoothing(),
        "seasonal": baselines.Seasonal(),
    }
    window = min(lstm_window, v0 // 3)
    if lstm is not None and window >= 2:
        models["lstm"] = lstm(window)
    predictions: dict[str, FloatArray] = {}
    for name, model in models.items():
        model.fit(matrix[:v0])
        predictions[name] = forecaster.rolling(model, matrix, v0)  # rows v0..end
    actual = matrix[test0:]
    chosen_rows, chosen = selector.select_rolling(
        predictions, matrix[v0:], validation_spans, validation_spans
    )
    scored = {name: p[validation_spans:] for name, p in predictions.items()}
    scored["selected"] = chosen_rows
    per_class = {name: rrmse.per_class(actual, p) for name, p in scored.items()}
    return {
        "span_s": span_s,
        "spans_fit": v0,
        "spans_validation": validation_spans,
        "spans_test": num_spans - test0,
        "classes": workload.k,
        "lstm_window": window if "lstm" in models else None,
        "rrmse": {name: _num(rrmse.overall(actual, p)) for name, p in scored.items()},
        "rrmse_per_class": {name: [_num(v) for v in values] for name, values in per_class.items()},
        "poisson_floor_per_class": [_num(v) for v in rrmse.poisson_floor_per_class(actual)],
        "selected_counts": dict(collections.Counter(chosen)),
        "test_mean_count_per_class": [_num(float(v)) for v in actual.mean(axis=0)],
    }
