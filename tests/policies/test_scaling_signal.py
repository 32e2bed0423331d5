"""The periodic scaling loop's signal and decision (`policies.scaling_signal`)."""

from __future__ import annotations

import math

import pytest

from tessera.policies.scaling import module_scaling as ms
from tessera.policies.scaling import signal as sig

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


def test_decide_up_restore_hold_with_hysteresis() -> None:
    late = sig.Window(gaps=100, late=10, mean_s=0.08)  # 10 % > 5 %
    assert sig.decide(late, ON, 0.05, batch_capped=False).kind == "up"
    assert sig.decide(late, ON, 0.05, batch_capped=True).kind == "up"
    # a violation is never evicted on, however long the calm before it
    assert sig.decide(late, ON, 0.05, False, calm_s=1e9, replicated=True).kind == "up"
    # too few gaps to judge, or no target: never up; a calm window never replicates
    assert sig.decide(sig.Window(4, 4, 0.2), ON, 0.05, False).kind == "hold"
    assert sig.decide(late, ON, 0.0, False).kind == "hold"
    assert sig.decide(sig.Window(100, 0, 0.01), ON, 0.05, False).kind == "hold"
    # a cut is lifted only well under the threshold (half of it)
    assert sig.decide(sig.Window(100, 4, 0.04), ON, 0.05, True).kind == "hold"
    assert sig.decide(sig.Window(100, 2, 0.04), ON, 0.05, True).kind == "restore"
    assert sig.decide(sig.Window(0, 0, 0), ON, 0.05, True).kind == "restore"
    assert sig.decide(late, ms.ScalingConfig(), 0.05, False).kind == "none"


def test_evict_only_after_a_sustained_calm() -> None:
    cfg = ms.ScalingConfig(enabled=True, evict_after_seconds=30.0)
    quiet, idle = sig.Window(100, 1, 0.01), sig.Window(0, 0, 0)  # 1 % <= 2.5 %; no load
    band = sig.Window(100, 4, 0.04)  # 4 %: neither calm nor violating
    assert sig.calm(quiet, cfg) and sig.calm(idle, cfg) and not sig.calm(band, cfg)
    assert sig.calm_for(20.0, quiet, cfg, 5.0) == 25.0
    assert sig.calm_for(20.0, band, cfg, 5.0) == 0.0  # the band resets the calm too

    def kind(w: sig.Window, calm_s: float, replicated: bool = True) -> str:
        return sig.decide(w, cfg, 0.05, False, calm_s=calm_s, replicated=replicated).kind

    assert kind(idle, 29.9) == "hold" and kind(idle, 30.0) == "evict"
    assert kind(quiet, 30.0) == "evict"
    assert kind(idle, 1e9, replicated=False) == "hold"  # nothing placed: nothing to evict
    assert kind(band, 1e9) == "hold"  # the band never evicts
    with pytest.raises(ValueError, match="evict_after_seconds"):
        ms.ScalingConfig(evict_after_seconds=0)


def _run(windows: list[sig.Window], cfg: ms.ScalingConfig, tick_s: float) -> list[str]:
    """The decisions of a loop fed `windows` every `tick_s`, placing a replica on "up"
    and evicting it on "evict" (what the control loop does with them)."""
    calm_s, placed, out = 0.0, False, []
    for w in windows:
        calm_s = sig.calm_for(calm_s, w, cfg, tick_s)
        d = sig.decide(w, cfg, 0.05, False, calm_s=calm_s, replicated=placed)
        placed = (placed or d.kind == "up") and d.kind != "evict"
        out.append(d.kind)
    return out


def test_the_loop_does_not_flap() -> None:
    cfg = ms.ScalingConfig(enabled=True, evict_after_seconds=20.0)
    late, quiet, idle = sig.Window(100, 30, 0.1), sig.Window(100, 1, 0.01), sig.Window(0, 0, 0)
    band = sig.Window(100, 4, 0.04)
    # a violation, a long calm: one up, one evict, then nothing more however long it lasts
    kinds = _run([late] + [idle] * 20, cfg, 5.0)
    assert kinds.count("up") == 1 and kinds.count("evict") == 1
    assert kinds.index("evict") == 4  # 4 calm windows of 5 s: 20 s
    # short violations every 15 s (under evictAfterSeconds apart): never evicted, and one
    # up per violation only (Algorithm 1 itself places nothing where a replica is)
    kinds = _run([late, quiet, quiet] * 10, cfg, 5.0)
    assert "evict" not in kinds
    # a load sitting in the band between half the threshold and the threshold: the
    # replica stays, nothing else happens
    kinds = _run([late] + [band] * 30, cfg, 5.0)
    assert kinds == ["up"] + ["hold"] * 30
