"""RRMSE: per class, pooled overall, and of the summed series, exactly as documented."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tessera.workload import rrmse


def test_per_class_definition() -> None:
    actual = np.array([[10.0, 1.0], [20.0, 3.0]])
    predicted = np.array([[13.0, 1.0], [16.0, 1.0]])
    # class 0: errors 3, -4 -> RMSE sqrt(12.5), mean 15; class 1: errors 0, -2 -> sqrt(2), 2
    assert rrmse.per_class(actual, predicted) == pytest.approx(
        [math.sqrt(12.5) / 15, math.sqrt(2) / 2]
    )


def test_overall_is_pooled_over_cells() -> None:
    actual = np.array([[10.0, 1.0], [20.0, 3.0]])
    predicted = np.array([[13.0, 1.0], [16.0, 1.0]])
    cells_rmse = math.sqrt((9 + 0 + 16 + 4) / 4)
    assert rrmse.overall(actual, predicted) == pytest.approx(cells_rmse / 8.5)
    # not the mean of per-class values, and errors across classes do not cancel
    assert rrmse.overall(actual, predicted) != pytest.approx(
        float(np.mean(rrmse.per_class(actual, predicted)))
    )


def test_total_is_rrmse_of_summed_series() -> None:
    actual = np.array([[10.0, 5.0], [10.0, 5.0]])
    predicted = np.array([[12.0, 3.0], [8.0, 7.0]])  # class errors cancel in the sum
    assert rrmse.total(actual, predicted) == 0.0
    assert rrmse.overall(actual, predicted) == pytest.approx(2 / 7.5)


def test_one_dimensional_series_and_scale_invariance() -> None:
    y = np.array([4.0, 6.0, 5.0])
    p = np.array([5.0, 5.0, 5.0])
    assert rrmse.overall(y, p) == pytest.approx(math.sqrt(2 / 3) / 5)
    assert rrmse.overall(10 * y, 10 * p) == pytest.approx(rrmse.overall(y, p))
    assert rrmse.overall(y, y) == 0.0


def test_undefined_and_invalid() -> None:
    per = rrmse.per_class(np.array([[0.0, 1.0]]), np.array([[1.0, 1.0]]))
    assert math.isnan(per[0]) and per[1] == 0.0
    with pytest.raises(ValueError, match="same"):
        rrmse.overall(np.zeros((3, 2)), np.zeros((3, 1)))
    with pytest.raises(ValueError, match="empty"):
        rrmse.overall(np.zeros((0, 2)), np.zeros((0, 2)))


def test_poisson_floor_matches_simulated_oracle() -> None:
    rates = np.array([[16.0, 4.0]] * 20_000)
    actual = np.random.default_rng(0).poisson(rates).astype(np.float64)
    oracle = rrmse.overall(actual, rates)
    assert rrmse.poisson_floor(actual) == pytest.approx(oracle, rel=0.02)
    assert rrmse.poisson_floor_per_class(actual) == pytest.approx([0.25, 0.5], rel=0.02)
    assert rrmse.poisson_floor(actual) == pytest.approx(1 / math.sqrt(10), rel=0.02)
