"""RRMSE, the forecast error figure: relative root mean squared error.

Callers: forecaster hyperparameter selection (training split only) and the predictor benchmark.
For counts y and predictions ŷ (T spans × C classes): per class
``RRMSE_c = sqrt(mean_t (ŷ − y)²) / mean_t y``; overall, pooled over cells,
``sqrt(mean_{t,c} (ŷ − y)²) / mean_{t,c} y`` (errors in different classes do not cancel, each
class weighs by its volume); total, the RRMSE of the summed series. A series whose actual mean
is 0 gives NaN. ``poisson_floor`` is a reference, not a model: the RRMSE an oracle knowing each
span's true rate would still have with Poisson arrivals, ``1 / sqrt(mean y)`` (about 0.27 at 13
requests per span).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


def _pair(actual: npt.ArrayLike, predicted: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
    y = np.asarray(actual, dtype=np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    if y.ndim == 1:
        y = y[:, None]
    if p.ndim == 1:
        p = p[:, None]
    if y.shape != p.shape or y.ndim != 2:
        raise ValueError(f"actual {y.shape} and predicted {p.shape} must be the same (T, C)")
    if y.shape[0] == 0:
        raise ValueError("RRMSE of an empty series")
    return y, p


def _ratio(rmse: float, mean: float) -> float:
    return float("nan") if mean == 0 else rmse / mean


def per_class(actual: npt.ArrayLike, predicted: npt.ArrayLike) -> list[float]:
    """RRMSE of each class (column); NaN where the class's actual mean is 0."""
    y, p = _pair(actual, predicted)
    rmse = np.sqrt(((p - y) ** 2).mean(axis=0))
    return [_ratio(float(r), float(m)) for r, m in zip(rmse, y.mean(axis=0), strict=True)]


def overall(actual: npt.ArrayLike, predicted: npt.ArrayLike) -> float:
    """Pooled RRMSE over all (span, class) cells (module docstring)."""
    y, p = _pair(actual, predicted)
    return _ratio(float(np.sqrt(((p - y) ** 2).mean())), float(y.mean()))


def total(actual: npt.ArrayLike, predicted: npt.ArrayLike) -> float:
    """RRMSE of the summed-over-classes series."""
    y, p = _pair(actual, predicted)
    return overall(y.sum(axis=1), p.sum(axis=1))


def poisson_floor(actual: npt.ArrayLike) -> float:
    """Pooled RRMSE of a Poisson-rate oracle: 1 / sqrt(mean cell count); NaN if no arrivals."""
    y, _ = _pair(actual, actual)
    mean = float(y.mean())
    return _ratio(float(np.sqrt(mean)), mean)


def poisson_floor_per_class(actual: npt.ArrayLike) -> list[float]:
    """`poisson_floor` of each class (column)."""
    y, _ = _pair(actual, actual)
    return [_ratio(float(np.sqrt(m)), float(m)) for m in y.mean(axis=0)]
