"""Arrival counts: bin typed requests into a (num_spans, num_classes) count matrix.

Callers: the predictor benchmark and the planner's control loop, which feed the matrix to
a `forecaster.Forecaster`. Span i covers ``[i * span_s, (i + 1) * span_s)`` seconds since
the first request. By default only complete spans are kept: a trace whose last request
arrives at t has ``floor(t / span_s)`` spans, and the requests after the last complete
span are dropped, because the end of that span was not observed and a truncated span
would look like a sudden drop in demand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from tessera.workload import classes, traces

DEFAULT_SPAN_S = 10.0

FloatArray = npt.NDArray[np.float64]


def complete_spans(last_timestamp: float, span_s: float) -> int:
    """Number of whole spans of `span_s` seconds in ``[0, last_timestamp]``."""
    if span_s <= 0:
        raise ValueError(f"span_s must be positive, got {span_s}")
    return max(0, math.floor(last_timestamp / span_s))


def count_matrix(
    timestamps: npt.ArrayLike,
    labels: npt.ArrayLike,
    num_classes: int,
    span_s: float = DEFAULT_SPAN_S,
    num_spans: int | None = None,
) -> FloatArray:
    """Count arrivals per (span, class); `num_spans` defaults to `complete_spans`.

    Requests at or past ``num_spans * span_s`` seconds are ignored. Returns float64 so the
    matrix feeds forecasters directly.
    """
    t = np.asarray(timestamps, dtype=np.float64).reshape(-1)
    c = np.asarray(labels, dtype=np.int64).reshape(-1)
    if t.shape != c.shape:
        raise ValueError(f"{t.size} timestamps but {c.size} labels")
    if num_classes < 1:
        raise ValueError(f"num_classes must be at least 1, got {num_classes}")
    if c.size and (c.min() < 0 or c.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes})")
    if (t < 0).any():
        raise ValueError("timestamps must be seconds since the first request (non-negative)")
    if num_spans is None:
        num_spans = complete_spans(float(t.max()) if t.size else 0.0, span_s)
    if num_spans < 1:
        raise ValueError(f"the trace is shorter than one span of {span_s} s")
    span = np.floor(t / span_s).astype(np.int64)
    keep = span < num_spans
    flat = np.bincount(span[keep] * num_classes + c[keep], minlength=num_spans * num_classes)
    return flat.reshape(num_spans, num_classes).astype(np.float64)


def class_counts(
    requests: Sequence[traces.Request],
    workload: classes.WorkloadClasses,
    span_s: float = DEFAULT_SPAN_S,
    num_spans: int | None = None,
) -> FloatArray:
    """`count_matrix` of `requests` typed by `workload` (any `cls` on them is ignored)."""
    labels = workload.classify_many(
        [r.input_tokens for r in requests], [r.output_tokens for r in requests]
    )
    return count_matrix(
        [r.timestamp for r in requests], labels, workload.k, span_s=span_s, num_spans=num_spans
    )
