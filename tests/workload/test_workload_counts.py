"""Arrival counts: binning into (spans, classes), complete spans only."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.workload import classes, counts, traces


def test_count_matrix_bins_by_span_and_class() -> None:
    t = [0.0, 0.5, 9.99, 10.0, 25.0, 29.9, 30.0, 31.0]
    c = [0, 1, 0, 1, 1, 0, 0, 1]
    m = counts.count_matrix(t, c, num_classes=2, span_s=10.0)
    # last request at 31 s: three complete spans; the partial fourth one is dropped
    assert m.tolist() == [[2.0, 1.0], [0.0, 1.0], [1.0, 1.0]]
    assert m.dtype == np.float64


def test_count_matrix_explicit_num_spans_keeps_partial_span() -> None:
    m = counts.count_matrix([0.0, 31.0], [0, 0], num_classes=1, span_s=10.0, num_spans=4)
    assert m[:, 0].tolist() == [1.0, 0.0, 0.0, 1.0]


def test_complete_spans() -> None:
    assert counts.complete_spans(3501.7, 10.0) == 350
    assert counts.complete_spans(30.0, 10.0) == 3
    with pytest.raises(ValueError, match="positive"):
        counts.complete_spans(10.0, 0.0)


def test_count_matrix_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="shorter than one span"):
        counts.count_matrix([0.0, 5.0], [0, 0], num_classes=1, span_s=10.0)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        counts.count_matrix([0.0, 50.0], [0, 2], num_classes=2)
    with pytest.raises(ValueError, match="2 timestamps but 1 labels"):
        counts.count_matrix([0.0, 50.0], [0], num_classes=1)


def test_class_counts_types_requests() -> None:
    requests = [traces.Request(float(i), 10 if i % 2 else 1000, 5) for i in range(40)]
    workload = classes.fit_classes(requests, k=2)
    m = counts.class_counts(requests, workload, span_s=10.0)
    assert m.tolist() == [[5.0, 5.0]] * 3


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=60),
    st.integers(1, 4),
    st.sampled_from([1.0, 2.5, 10.0]),
)
def test_counts_conserve_requests_in_whole_spans(
    stamps: list[float], k: int, span_s: float
) -> None:
    stamps = [*stamps, 100.0]
    labels = [i % k for i in range(len(stamps))]
    m = counts.count_matrix(stamps, labels, num_classes=k, span_s=span_s)
    end = len(m) * span_s
    assert m.shape == (counts.complete_spans(100.0, span_s), k)
    assert m.sum() == sum(1 for s in stamps if s < end)
