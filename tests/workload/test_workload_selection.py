"""Seasonal baseline and the recent-best selector."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.workload import baselines, forecaster, rrmse, selector


def _periodic(spans: int = 120, period: int = 6) -> np.ndarray:
    t = np.arange(spans)
    a = 10 + 8 * np.sin(2 * np.pi * t / period)
    b = 5 + 0 * t
    return np.stack([a, b], axis=1).astype(np.float64)


def test_seasonal_finds_the_period_and_beats_last_value() -> None:
    series = _periodic()
    model = baselines.Seasonal()
    model.fit(series[:90])
    assert model.period in (6, 12, 18) and model.period % 6 == 0
    pred = forecaster.rolling(model, series, 90)
    last = forecaster.rolling(baselines.LastValue(), series, 90)
    assert rrmse.overall(series[90:], pred) < 1e-9
    assert rrmse.overall(series[90:], last) > 0.2


def test_seasonal_short_history_falls_back_to_last_value() -> None:
    model = baselines.Seasonal(period=10, cycles=2)
    history = np.asarray([[1.0], [2.0], [3.0]])
    assert model.predict(history)[0] == 3.0
    with pytest.raises(ValueError):
        baselines.Seasonal(period=0)


def test_select_rolling_switches_to_whatever_did_best_recently() -> None:
    actual = np.arange(40, dtype=np.float64).reshape(-1, 1)
    good_first = np.where(np.arange(40) < 20, actual[:, 0], actual[:, 0] + 10).reshape(-1, 1)
    good_later = np.where(np.arange(40) < 20, actual[:, 0] + 10, actual[:, 0]).reshape(-1, 1)
    rows, chosen = selector.select_rolling(
        {"a": good_first, "b": good_later}, actual, start=5, window=3
    )
    assert chosen[:15] == ["a"] * 15  # spans 5..19
    assert chosen[-10:] == ["b"] * 10
    assert rows.shape == (35, 1)
    with pytest.raises(ValueError):
        selector.select_rolling({"a": actual}, actual, start=1, window=3)


def test_best_recent_forecaster_matches_select_rolling() -> None:
    series = _periodic(80)
    models = {"last_value": baselines.LastValue(), "seasonal": baselines.Seasonal(period=6)}
    picker = selector.BestRecent(dict(models), window=4)
    picker.fit(series[:40])
    online = forecaster.rolling(picker, series, 40)
    assert picker.chosen == "seasonal"
    assert rrmse.overall(series[48:], online[8:]) < 1e-9  # once the window has seen both
