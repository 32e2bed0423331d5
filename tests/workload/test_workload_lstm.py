"""LSTM forecaster: learns a periodic signal the baselines cannot follow; deterministic per seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tessera.workload import baselines, forecaster, lstm, rrmse


def _periodic() -> np.ndarray:
    t = np.arange(200)
    wave = np.sin(2 * np.pi * t / 6)
    return np.stack([10 + 6 * wave, 4 - 3 * wave], axis=1).round()


def _tiny(**kwargs: object) -> lstm.LSTMForecaster:
    return lstm.LSTMForecaster(window=12, hidden=16, epochs=60, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("residual", [True, False])
def test_lstm_learns_a_periodic_signal(residual: bool) -> None:
    counts = _periodic()
    start = 180
    model = _tiny(residual=residual)
    model.fit(counts[:start])
    lstm_err = rrmse.overall(counts[start:], forecaster.rolling(model, counts, start))
    naive = baselines.LastValue()
    naive_err = rrmse.overall(counts[start:], forecaster.rolling(naive, counts, start))
    assert lstm_err < 0.4 * naive_err
    assert 0 <= model.best_epoch < model.epochs


def test_lstm_is_deterministic_for_a_seed_and_leaves_global_rng_alone() -> None:
    counts = np.random.default_rng(0).poisson(8, size=(60, 2)).astype(np.float64)
    before = torch.random.get_rng_state()
    runs = []
    for seed in (3, 3, 4):
        model = lstm.LSTMForecaster(window=8, hidden=8, epochs=5, seed=seed)
        model.fit(counts[:50])
        runs.append(forecaster.rolling(model, counts, 50))
    assert np.array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])
    assert torch.equal(torch.random.get_rng_state(), before)
    assert (runs[0] >= 0).all()


def test_lstm_residual_alpha_matches_exp_smoothing_choice() -> None:
    counts = np.random.default_rng(1).poisson(8, size=(60, 2)).astype(np.float64)
    model = lstm.LSTMForecaster(window=8, hidden=4, epochs=1)
    model.fit(counts)
    smoother = baselines.ExpSmoothing()
    smoother.fit(counts)
    assert model.alpha == smoother.alpha


def test_lstm_short_history_and_errors() -> None:
    counts = np.ones((30, 1))
    model = lstm.LSTMForecaster(window=8, hidden=4, epochs=2)
    with pytest.raises(RuntimeError, match="before fit"):
        model.predict(counts)
    model.fit(counts)
    assert model.predict(counts[:3]).shape == (1,)  # left-padded with training means
    with pytest.raises(ValueError, match="more than window=50"):
        lstm.LSTMForecaster().fit(counts)
    with pytest.raises(ValueError, match="at least 1"):
        lstm.LSTMForecaster(window=0)
