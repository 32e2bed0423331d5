"""The latency model's calibration (issue 34): one factor per layout from its fit
samples, errors on held-out samples, the raw model's largest error for a layout never
measured; and the simulator's calibration samples on a small cluster."""

from __future__ import annotations

import pytest

from tessera.cost import calibration as cal


def test_factor_per_layout_and_held_out_error() -> None:
    s = [
        cal.Sample("A", 10.0, 12.0, "fit"),
        cal.Sample("A", 20.0, 24.4, "fit"),
        cal.Sample("A", 8.0, 10.0, "eval"),
        cal.Sample("B", 10.0, 9.0, "fit"),
    ]
    c = cal.fit(s)
    a, b = c.layouts["A"], c.layouts["B"]
    assert a.factor == pytest.approx(1.21)
    assert a.held_out and a.eval_samples == 1
    assert a.max == pytest.approx(abs(8 * 1.21 - 10) / 10)
    assert a.raw_max == pytest.approx(0.2)
    assert not b.held_out and b.max == pytest.approx(0.0)  # in-sample, one point
    assert c.price("A", 10.0) == pytest.approx(12.1)
    assert c.error("A") == pytest.approx(a.max)
    # a layout never measured: the raw price and the largest raw error seen
    assert c.price("C", 10.0) == 10.0
    assert c.error("C") == pytest.approx(0.2)
    doc = c.to_json()
    assert doc["error_max"] == pytest.approx(round(a.max, 4), abs=1e-4)


def test_samples_are_validated() -> None:
    with pytest.raises(ValueError):
        cal.Sample("A", 0.0, 1.0)
    with pytest.raises(ValueError):
        cal.Sample("A", 1.0, 1.0, "test")
