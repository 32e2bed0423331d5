"""LSTM forecaster of per-class arrivals: the only module of the core that imports torch.

Callers: the predictor benchmark and, optionally, the planner's control loop (through
`forecaster.Forecaster`). Reads the last `window` spans of per-class counts (default 50) and
predicts the next span's. Inputs and targets are divided per class by its training mean. One
LSTM layer and a linear head; with ``residual`` (default) the head corrects the window's
exponentially smoothed level (smoothing chosen as `baselines.ExpSmoothing` does: ES-RNN-like;
docs/workload.md says why). Adam on mini-batches for `epochs`; the epoch with the lowest loss
on the held-out last `validation_fraction` of windows is kept. Deterministic: a forked RNG from
`seed` (the caller's global RNG untouched) and deterministic algorithms, so a seed gives the
same predictions for the same thread count.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from tessera.workload import baselines, forecaster

DEFAULT_WINDOW = 50

FloatArray = npt.NDArray[np.float64]


class _Net(nn.Module):
    """LSTM over (batch, window, classes) → next-span counts (batch, classes), scaled."""

    def __init__(self, classes: int, hidden: int, window: int, alpha: float | None) -> None:
        super().__init__()
        self.lstm = nn.LSTM(classes, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)
        self.residual = alpha is not None
        # Exponential smoothing over the window as one weighted sum; the oldest span also
        # carries the initial level's weight, as in baselines.ExpSmoothing.
        a = alpha if alpha is not None else 1.0
        weights = a * (1 - a) ** torch.arange(window - 1, -1, -1, dtype=torch.float32)
        weights[0] = (1 - a) ** (window - 1)
        self.register_buffer("smoothing", weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        y: torch.Tensor = self.head(out[:, -1])
        if not self.residual:
            return y
        smoothing: torch.Tensor = self.smoothing  # type: ignore[assignment]
        return y + (x * smoothing[None, :, None]).sum(dim=1)


@dataclasses.dataclass
class LSTMForecaster:
    """Per-class next-span counts from the last `window` spans (module docstring)."""

    window: int = DEFAULT_WINDOW  # spans of history the net reads
    hidden: int = 64  # LSTM hidden size
    epochs: int = 150  # training epochs (the best validation epoch is kept)
    batch_size: int = 32
    lr: float = 3e-3  # Adam learning rate
    residual: bool = True  # correct an exponential-smoothing level instead of predicting it
    validation_fraction: float = 0.1  # last training windows held out to pick the epoch
    seed: int = 0
    alpha: float | None = dataclasses.field(default=None, init=False)  # set by fit
    best_epoch: int = dataclasses.field(default=-1, init=False)  # set by fit
    _net: _Net | None = dataclasses.field(default=None, init=False, repr=False)
    _scale: FloatArray | None = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.window < 1 or self.hidden < 1 or self.epochs < 1 or self.batch_size < 1:
            raise ValueError("window, hidden, epochs and batch_size must be at least 1")
        if not 0 <= self.validation_fraction < 1:
            raise ValueError("validation_fraction must be in [0, 1)")

    def fit(self, history: FloatArray) -> None:
        """Train on every `window`-span slice of `history` and the span that follows it."""
        forecaster.check_history(history)
        if len(history) <= self.window:
            raise ValueError(
                f"LSTM needs more than window={self.window} spans of history, got {len(history)}"
            )
        means = history.mean(axis=0)
        self._scale = np.where(means > 0, means, 1.0)
        scaled = history / self._scale
        if self.residual:
            smoother = baselines.ExpSmoothing()
            smoother.fit(history)
            self.alpha = smoother.alpha
        starts = np.arange(len(history) - self.window)
        x = np.stack([scaled[i : i + self.window] for i in starts])
        y = scaled[starts + self.window]
        n_val = int(len(x) * self.validation_fraction)
        deterministic = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                self._net = self._train(x, y, n_val)
        finally:
            torch.use_deterministic_algorithms(deterministic)

    def _train(self, x: FloatArray, y: FloatArray, n_val: int) -> _Net:
        net = _Net(x.shape[2], self.hidden, self.window, self.alpha)
        xt = torch.tensor(x, dtype=torch.float32)
        yt = torch.tensor(y, dtype=torch.float32)
        n_train = len(xt) - n_val
        x_train, y_train, x_val, y_val = xt[:n_train], yt[:n_train], xt[n_train:], yt[n_train:]
        optimizer = torch.optim.Adam(net.parameters(), lr=self.lr)
        loss_fn = nn.MSELoss()
        best_loss, best_state = float("inf"), copy.deepcopy(net.state_dict())
        self.best_epoch = self.epochs - 1
        for epoch in range(self.epochs):
            net.train()
            order = torch.randperm(n_train)
            for i in range(0, n_train, self.batch_size):
                batch = order[i : i + self.batch_size]
                optimizer.zero_grad()
                loss = loss_fn(net(x_train[batch]), y_train[batch])
                loss.backward()
                optimizer.step()
            if n_val:
                net.eval()
                with torch.no_grad():
                    val = float(loss_fn(net(x_val), y_val))
                if val < best_loss:
                    best_loss, best_state = val, copy.deepcopy(net.state_dict())
                    self.best_epoch = epoch
        net.load_state_dict(best_state if n_val else net.state_dict())
        net.eval()
        return net

    def predict(self, history: FloatArray) -> FloatArray:
        """Next-span counts from the last `window` rows (left-padded with training means)."""
        forecaster.check_history(history)
        if self._net is None or self._scale is None:
            raise RuntimeError("LSTMForecaster.predict called before fit")
        scaled = history[-self.window :] / self._scale
        if len(scaled) < self.window:
            pad = np.ones((self.window - len(scaled), scaled.shape[1]))
            scaled = np.vstack([pad, scaled])
        with torch.no_grad():
            out = self._net(torch.tensor(scaled[None], dtype=torch.float32))[0]
        pred = out.numpy().astype(np.float64) * self._scale
        return np.asarray(np.clip(pred, 0.0, None), dtype=np.float64)


def num_threads() -> int:
    """torch's intra-op thread count (results are deterministic for a seed at a fixed count)."""
    return torch.get_num_threads()
