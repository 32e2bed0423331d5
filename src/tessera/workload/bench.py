"""Per-class arrival forecasting: LSTM vs baselines (RRMSE).

`tessera bench predictor --json [--trace PATH]` (dispatched by tessera.cli.bench). Reads a
trace, fits k-means classes on the training part, bins per-class arrivals into spans, trains
every forecaster on the first 90 % of spans, and scores one-step-ahead rolling predictions on
the last 10 % with RRMSE (`rrmse`); hyperparameters come from the training spans only.
``forecast_quality`` repeats it with a validation window (`quality`), per class, at the bench
span and the planner's (``--planner-span-s``), with a seasonal baseline and a best-on-recent
selector. ``live_classification`` is the misclassification rate of arrival-time classes
(`live_classes`) against a nearest-centroid-input baseline. Keys: docs/workload.md.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tessera.workload import (
    baselines,
    classes,
    counts,
    forecaster,
    live_classes,
    lstm,
    plot,
    quality,
    rrmse,
    traces,
)

DEFAULT_TRACE = Path(__file__).parents[3].parent / "shared/traces/azure_llm_2023_conv.csv"
TRACE_ENV = "TESSERA_TRACE"
FloatArray = npt.NDArray[np.float64]

MODELS = ("lstm", "moving_average", "last_value", "exp_smoothing", "seasonal")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `tessera bench predictor`."""
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        help=f"trace file (Azure/BurstGPT CSV or Tessera JSONL); default ${TRACE_ENV} "
        f"or {DEFAULT_TRACE}",
    )
    parser.add_argument("--span-s", type=float, default=counts.DEFAULT_SPAN_S, help="span, s")
    parser.add_argument(
        "--classes",
        type=int,
        default=None,
        metavar="K",
        help="number of request classes (default: chosen by the silhouette criterion)",
    )
    parser.add_argument(
        "--window", type=int, default=lstm.DEFAULT_WINDOW, help="LSTM input window, spans"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of k-means and the LSTM")
    parser.add_argument("--epochs", type=int, default=150, help="LSTM training epochs")
    parser.add_argument("--hidden", type=int, default=64, help="LSTM hidden size")
    parser.add_argument(
        "--plot", type=Path, default=None, help="write predicted vs actual (test split) PNG"
    )
    parser.add_argument(
        "--planner-span-s",
        type=float,
        default=60.0,
        help="the planner's span for the forecast_quality block (0: skip it)",
    )
    parser.add_argument(
        "--validation-spans",
        type=int,
        default=10,
        help="recent spans the selector scores methods on (forecast_quality)",
    )


def trace_path(arg: Path | None) -> Path:
    """--trace if given (`tessera bench` makes $TESSERA_TRACE its default), else the
    shared Azure conversation trace."""
    return arg if arg is not None else DEFAULT_TRACE


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark and return its figures as one JSON-serialisable dict."""
    path = trace_path(args.trace)
    span_s = float(args.span_s)
    requests = traces.read_trace(path)
    num_spans = counts.complete_spans(requests[-1].timestamp, span_s)
    test0 = forecaster.split(num_spans)
    if test0 <= args.window:
        raise ValueError(
            f"{path}: {test0} training spans of {span_s:g} s do not exceed the LSTM window "
            f"of {args.window}; use a longer trace, a shorter --span-s or a smaller --window"
        )
    train_requests = [r for r in requests if r.timestamp < test0 * span_s]
    workload = classes.fit_classes(train_requests, k=args.classes, seed=args.seed)
    matrix = counts.class_counts(requests, workload, span_s, num_spans)
    train, actual = matrix[:test0], matrix[test0:]

    ma = baselines.MovingAverage()
    es = baselines.ExpSmoothing()
    seasonal = baselines.Seasonal()
    net = lstm.LSTMForecaster(
        window=args.window, hidden=args.hidden, epochs=args.epochs, seed=args.seed
    )
    models: dict[str, forecaster.Forecaster] = {
        "lstm": net,
        "moving_average": ma,
        "last_value": baselines.LastValue(),
        "exp_smoothing": es,
        "seasonal": seasonal,
    }
    predictions: dict[str, FloatArray] = {}
    train_s = predict_s = 0.0
    for name, model in models.items():
        start = time.perf_counter()
        model.fit(train)
        fitted = time.perf_counter()
        predictions[name] = forecaster.rolling(model, matrix, test0)
        if name == "lstm":
            train_s, predict_s = fitted - start, time.perf_counter() - fitted

    if args.plot is not None:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        titles = [_class_title(workload, c, actual) for c in range(workload.k)]
        plot.predictions_png(args.plot, actual, predictions, span_s, test0, titles)

    per_class_rrmse = {name: rrmse.per_class(actual, p) for name, p in predictions.items()}

    def make_lstm(window: int) -> forecaster.Forecaster:
        return lstm.LSTMForecaster(
            window=window, hidden=args.hidden, epochs=args.epochs, seed=args.seed
        )

    spans = [span_s] + ([float(args.planner_span_s)] if args.planner_span_s > 0 else [])
    quality_blocks = []
    for s_len in dict.fromkeys(spans):
        try:
            quality_blocks.append(
                quality.evaluate(
                    requests,
                    s_len,
                    workload.k,  # the k chosen above (no second silhouette search)
                    args.seed,
                    make_lstm,
                    args.window,
                    validation_spans=args.validation_spans,
                )
            )
        except ValueError as exc:  # too few spans at this length: say so, do not fail
            quality_blocks.append({"span_s": s_len, "skipped": str(exc)})
    live = live_classes.fit(train_requests, workload)
    test_requests = [r for r in requests if test0 * span_s <= r.timestamp < num_spans * span_s]
    missed = live_classes.misclassification(live, workload, test_requests)
    truth = workload.classify_many(
        [r.input_tokens for r in test_requests], [r.output_tokens for r in test_requests]
    )
    nearest = live_classes.input_nearest(workload, [r.input_tokens for r in test_requests])
    floors = rrmse.poisson_floor_per_class(actual)
    result: dict[str, Any] = {
        f"rrmse_{name}": _num(rrmse.overall(actual, predictions[name])) for name in MODELS
    }
    result.update(
        trace=str(path),
        requests=len(requests),
        seed=args.seed,
        span_s=span_s,
        spans_train=test0,
        spans_test=num_spans - test0,
        classes=workload.k,
        k_criterion=workload.criterion,
        silhouettes={str(k): _num(s) for k, s in workload.silhouettes},
        rrmse_total={name: _num(rrmse.total(actual, predictions[name])) for name in MODELS},
        rrmse_poisson_floor=_num(rrmse.poisson_floor(actual)),
        per_class=[
            {
                "class": c,
                "centroid_tokens": [round(v, 1) for v in workload.centroids[c]],
                "share": _num(workload.shares[c]),
                "test_mean_count": _num(float(actual[:, c].mean())),
                "rrmse": {name: _num(per_class_rrmse[name][c]) for name in MODELS},
                "poisson_floor": _num(floors[c]),
            }
            for c in range(workload.k)
        ],
        hyperparameters={
            "moving_average_window": ma.window,
            "exp_smoothing_alpha": es.alpha,
            "seasonal_period_spans": seasonal.period,
            "seasonal_cycles": seasonal.cycles,
            "lstm": {
                "window": net.window,
                "hidden": net.hidden,
                "epochs": net.epochs,
                "best_epoch": net.best_epoch,
                "lr": net.lr,
                "batch_size": net.batch_size,
                "residual_alpha": net.alpha,
            },
        },
        forecast_quality=quality_blocks,
        live_classification={
            "method": "argmax_c n[input bin, c] (no max_tokens in the trace)",
            "fit": "training spans",
            "evaluated_requests": missed.requests,
            "misclassification_rate": _num(missed.rate),
            "per_class": [_num(v) for v in missed.per_class],
            "confusion": [list(row) for row in missed.confusion],
            "baseline_nearest_input_rate": _num(float((nearest != truth).mean())),
        },
        train_s=round(train_s, 3),
        predict_ms=round(1000 * predict_s / max(1, len(actual)), 3),
        torch_threads=lstm.num_threads(),
        plot=None if args.plot is None else str(args.plot),
    )
    return result


def _class_title(workload: classes.WorkloadClasses, c: int, actual: FloatArray) -> str:
    inp, out = workload.centroids[c]
    return (
        f"class {c}: ~{inp:.0f} in / {out:.0f} out tokens, "
        f"{100 * workload.shares[c]:.0f} % of requests, test mean {actual[:, c].mean():.1f}/span"
    )


def _num(x: float) -> float | None:
    """Round for the report; NaN (undefined RRMSE) becomes null."""
    return None if math.isnan(x) else round(float(x), 4)
