"""Plot of predicted vs actual per-class arrivals on the test split, as a PNG.

Caller: the predictor benchmark (``--plot PATH``). Uses matplotlib's object API (no
pyplot, so no global figure state) and the Agg canvas, so it works headless.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

FloatArray = npt.NDArray[np.float64]


def predictions_png(
    path: str | os.PathLike[str],
    actual: FloatArray,
    predicted: Mapping[str, FloatArray],
    span_s: float,
    first_span: int,
    titles: Sequence[str],
) -> None:
    """One panel per class: actual counts and each forecaster's one-step predictions."""
    spans, classes = actual.shape
    t = (first_span + np.arange(spans)) * span_s / 60.0
    fig = Figure(figsize=(9, 2.2 * classes + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(classes, 1, sharex=True, squeeze=False)[:, 0]
    for c, ax in enumerate(axes):
        ax.plot(t, actual[:, c], color="black", linewidth=2.0, label="actual")
        for name, pred in predicted.items():
            ax.plot(t, pred[:, c], linewidth=1.2, label=name)
        ax.set_title(titles[c], fontsize=9)
        ax.set_ylabel(f"requests / {span_s:g} s", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncols=len(predicted) + 1, loc="upper right")
    axes[-1].set_xlabel("minutes since the first request")
    fig.savefig(os.fspath(path), dpi=110)
