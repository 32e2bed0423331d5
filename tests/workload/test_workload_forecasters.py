"""Baseline forecasters, the train/test split and the one-step-ahead rolling evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.workload import baselines, forecaster, rrmse


def _noisy_level_shift(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    level = np.where(np.arange(200) < 100, 20.0, 40.0)
    return np.stack([rng.poisson(level), rng.poisson(level / 4)], axis=1).astype(np.float64)


def test_split_is_ninety_ten() -> None:
    assert forecaster.split(350) == 315
    assert forecaster.split(10) == 9
    with pytest.raises(ValueError, match="cannot be split"):
        forecaster.split(1)


def test_rolling_sees_history_up_to_the_predicted_span() -> None:
    counts = np.arange(12, dtype=np.float64).reshape(6, 2)
    preds = forecaster.rolling(baselines.LastValue(), counts, 3)
    assert preds.tolist() == counts[2:5].tolist()
    assert forecaster.rolling(baselines.LastValue(), counts, 6).shape == (0, 2)


def test_last_value() -> None:
    history = np.array([[1.0, 2.0], [3.0, 4.0]])
    model = baselines.LastValue()
    model.fit(history)
    assert model.predict(history).tolist() == [3.0, 4.0]
    with pytest.raises(ValueError, match="non-empty"):
        model.predict(np.zeros((0, 2)))


def test_moving_average_fixed_window_and_short_history() -> None:
    history = np.array([[1.0], [2.0], [3.0], [6.0]])
    model = baselines.MovingAverage(window=3)
    model.fit(history)
    assert model.window == 3
    assert model.predict(history).tolist() == [pytest.approx(11 / 3)]
    assert model.predict(history[:2]).tolist() == [1.5]
    with pytest.raises(ValueError, match="window"):
        baselines.MovingAverage(window=0)


def test_moving_average_window_tuned_on_fit_history_only() -> None:
    constant_noisy = np.random.default_rng(1).poisson(30, size=(150, 1)).astype(np.float64)
    model = baselines.MovingAverage()
    model.fit(constant_noisy)
    assert model.window is not None and model.window >= 12  # noise → long window
    alternating = np.tile([[0.0], [10.0]], (40, 1))
    model = baselines.MovingAverage()
    model.fit(alternating)
    assert model.window == 2  # the even window that averages the cycle out


def test_exp_smoothing_recursion() -> None:
    history = np.array([[10.0], [20.0], [0.0]])
    model = baselines.ExpSmoothing(alpha=0.5)
    model.fit(history)
    # level: 10 → 15 → 7.5
    assert model.predict(history).tolist() == [7.5]
    with pytest.raises(ValueError, match="alpha"):
        baselines.ExpSmoothing(alpha=0.0)


def test_exp_smoothing_alpha_tuned_and_only_on_train() -> None:
    counts = _noisy_level_shift()
    start = forecaster.split(len(counts))
    model = baselines.ExpSmoothing()
    model.fit(counts[:start])
    chosen = model.alpha
    assert chosen in baselines.ALPHAS
    # tuning on the train split must not depend on the test split
    garbage_test = counts.copy()
    garbage_test[start:] = 1000.0
    other = baselines.ExpSmoothing()
    other.fit(garbage_test[:start])
    assert other.alpha == chosen


def test_smoothing_baselines_beat_last_value_on_noise() -> None:
    counts = np.random.default_rng(2).poisson([20.0, 5.0], size=(200, 2)).astype(np.float64)
    start = forecaster.split(len(counts))
    models: dict[str, forecaster.Forecaster] = {
        "last": baselines.LastValue(),
        "ma": baselines.MovingAverage(),
        "es": baselines.ExpSmoothing(),
    }
    scores = {}
    for name, model in models.items():
        model.fit(counts[:start])
        scores[name] = rrmse.overall(counts[start:], forecaster.rolling(model, counts, start))
    assert scores["ma"] < 0.8 * scores["last"]
    assert scores["es"] < 0.8 * scores["last"]


def test_regime_mean_pools_the_spans_since_the_mix_changed() -> None:
    rng = np.random.default_rng(3)
    before = rng.poisson([250, 250, 260, 200], size=(4, 4)).astype(np.float64)
    after = rng.poisson([180, 190, 350, 270], size=(3, 4)).astype(np.float64)
    model = baselines.RegimeMean()
    model.fit(before)
    # a steady mix: every span; right after a change: the new spans only
    assert model.predict(before).tolist() == pytest.approx(before.mean(axis=0).tolist())
    history = np.vstack([before, after])
    assert model.predict(history).tolist() == pytest.approx(after.mean(axis=0).tolist())
    assert model.predict(history[:5]).tolist() == history[4].tolist()


def test_regime_mean_is_closer_than_last_value_on_a_steady_mix() -> None:
    # Poisson counts of one mix: one span's counts are noisier than their mean
    rng = np.random.default_rng(4)
    means = np.array([187.0, 190.0, 340.0, 280.0])
    errs: dict[str, list[float]] = {"regime": [], "last": []}
    for _ in range(50):
        h = rng.poisson(means, size=(4, 4)).astype(np.float64)
        errs["regime"].append(float(np.abs(baselines.RegimeMean().predict(h) - means).sum()))
        errs["last"].append(float(np.abs(baselines.LastValue().predict(h) - means).sum()))
    assert np.mean(errs["regime"]) < 0.7 * np.mean(errs["last"])


def test_same_regime_tests_only_classes_it_can() -> None:
    expected = np.array([100.0, 100.0, 2.0])
    assert baselines.same_regime(np.array([104.0, 95.0, 3.0]), expected)  # class 3: too few
    assert not baselines.same_regime(np.array([104.0, 95.0, 12.0]), expected)  # now enough
    assert not baselines.same_regime(np.array([150.0, 95.0, 2.0]), expected)
    assert not baselines.same_regime(np.array([100.0, 6.0]), np.array([100.0, 0.0]))
    assert baselines.same_regime(np.array([1.0, 0.0]), np.array([2.0, 1.0]))  # none testable
