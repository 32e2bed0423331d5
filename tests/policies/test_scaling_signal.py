"""The periodic scaling loop's signal and decision (`policies.scaling_signal`)."""

from __future__ import annotations

import math

import pytest

from tessera.policies import module_scaling as ms
from tessera.policies import scaling_signal as sig

BOUNDS = (0.01, 0.05, 0.1, math.inf)
ON = ms.ScalingConfig(enabled=True)  # downViolationRate 0.05


def _h(counts: tuple[float, ...], sum_s: float) -> sig.Hist:
    return sig.Hist(BOUNDS, counts, counts[-1], sum_s)


def test_window_counts_only_the_gaps_since_the_last_tick() -> None:
    prev = _h((10, 10, 10, 10), 0.05)  # 10 fast gaps earlier
    now = _h((10, 20, 30, 40), 3.05)  # then 10 in (0.01, 0.05], 10 in (0.05, 0.1], 10 above
    w = sig.window(prev, now, target_s=0.05)
    assert w.gaps == 30 and w.late == pytest.approx(20)
    assert w.violation_rate == pytest.approx(2 / 3)
    assert w.mean_s == pytest.approx(0.1)
    # a target inside a bucket interpolates: 0.075 is half of (0.05, 0.1]
    assert sig.window(prev, now, 0.075).late == pytest.approx(15)
    # above the largest finite bound everything there is late; no target: none is
    assert sig.window(prev, now, 1.0).late == pytest.approx(10)
    assert sig.window(prev, now, 0.0).late == 0
    assert sig.window(now, now, 0.05) == sig.Window(0, 0, 0)
    with pytest.raises(ValueError, match="bounds differ"):
        sig.window(sig.Hist((1.0,), (0,), 0, 0), now, 0.05)


def test_decide_down_up_restore_with_hysteresis() -> None:
    late = sig.Window(gaps=100, late=10, mean_s=0.08)  # 10 % > 5 %
    assert sig.decide(late, ON, 0.05, batch_capped=False).kind == "down"
    assert sig.decide(late, ON, 0.05, batch_capped=True).kind == "down"
    # too few gaps to judge, or no target: never down
    assert sig.decide(sig.Window(4, 4, 0.2), ON, 0.05, False).kind == "up"
    assert sig.decide(late, ON, 0.0, False).kind == "up"
    # a cut is lifted only well under the threshold (half of it)
    assert sig.decide(sig.Window(100, 4, 0.04), ON, 0.05, True).kind == "up"
    assert sig.decide(sig.Window(100, 2, 0.04), ON, 0.05, True).kind == "restore"
    assert sig.decide(sig.Window(0, 0, 0), ON, 0.05, True).kind == "restore"
    assert sig.decide(late, ms.ScalingConfig(), 0.05, False).kind == "none"
