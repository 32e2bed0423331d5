"""Overload monitor and restore decision (KunServe §4.1, §4.4)."""

from __future__ import annotations

import pytest

from tessera.policies.overload import monitor as ov

ON = ov.OverloadConfig(enabled=True)


def test_demand_counts_queued_not_just_used() -> None:
    kv = ov.ReplicaKV("r0", pool_bytes=1000, running_bytes=600, queued_bytes=(300, 200))
    v = ov.verdict(kv, ON)
    assert v.demand_bytes == 1100 and v.queued_bytes == 500 and v.fires


def test_fires_about_to_overflow_at_threshold() -> None:
    near = ov.ReplicaKV("r0", 1000, 850, (50,))  # 900 = 90 % of the pool
    below = ov.ReplicaKV("r1", 1000, 800, (50,))  # 85 %
    d = ov.assess([near, below], ON)
    assert d.fire and d.required_bytes == 50 and d.reason == ov.REASON_OVERLOAD
    assert [v.fires for v in d.replicas] == [True, False]
    assert "r0" in d.message and "r1" not in d.message


def test_full_pool_without_queue_is_not_overload() -> None:
    d = ov.assess([ov.ReplicaKV("r0", 1000, 1000, ())], ON)
    assert not d.fire and d.required_bytes == 0


def test_r_is_queued_demand_of_firing_replicas() -> None:
    reps = [ov.ReplicaKV(f"r{i}", 1000, 900, (100, 100)) for i in range(3)]
    assert ov.assess(reps, ON).required_bytes == 600
    head = ov.OverloadConfig(enabled=True, head_of_line=1)
    assert ov.assess(reps, head).required_bytes == 300


def test_disabled_never_fires() -> None:
    d = ov.assess([ov.ReplicaKV("r0", 1000, 1000, (500,))], ov.OverloadConfig())
    assert not d.fire and "disabled" in d.message


def test_restore_below_half_of_pre_drop_pool() -> None:
    """Two replicas of 1000-byte pools each dropped half their layers (pools now larger);
    restore when demand < 50 % of the 2000 pre-drop bytes."""
    grown = [ov.ReplicaKV(f"r{i}", 1800, 400, (), pre_drop_pool_bytes=1000) for i in range(2)]
    r = ov.assess_restore(grown, ON)
    assert r.restore and r.limit_bytes == 1000 and r.demand_bytes == 800
    busy = [ov.ReplicaKV(f"r{i}", 1800, 400, (100,), pre_drop_pool_bytes=1000) for i in range(2)]
    assert not ov.assess_restore(busy, ON).restore  # 1000 is not below 1000


def test_thresholds_validated() -> None:
    with pytest.raises(ValueError, match="drop_threshold"):
        ov.OverloadConfig(drop_threshold=1.5)
    with pytest.raises(ValueError, match="restore_threshold"):
        ov.OverloadConfig(drop_threshold=0.5, restore_threshold=0.6)


def test_request_kv_bytes_rounds_to_pages() -> None:
    assert ov.request_kv_bytes(17, 0, 16, 64) == 128
    assert ov.request_kv_bytes(10, 6, 16, 64) == 64


def test_restore_held_until_demand_stayed_low() -> None:
    cfg = ov.OverloadConfig(enabled=True, restore_hold_s=1.0)
    low = ov.assess_restore([ov.ReplicaKV("r0", 300, 10, (), 200)], cfg)
    high = ov.assess_restore([ov.ReplicaKV("r0", 300, 150, (), 200)], cfg)
    assert low.restore and not high.restore
    first = ov.hold_restore(low, None, 10.0, cfg)
    assert not first.decision.restore and first.below_since == 10.0
    assert first.decision.reason == ov.REASON_HOLD_TIME
    assert not ov.hold_restore(low, 10.0, 10.9, cfg).decision.restore
    assert ov.hold_restore(low, 10.0, 11.0, cfg).decision == low
    assert ov.hold_restore(high, 10.0, 11.0, cfg) == ov.HeldRestore(high, None)  # hold restarts
    assert ov.hold_restore(low, None, 5.0, ov.OverloadConfig(restore_hold_s=0.0)).decision == low
    with pytest.raises(ValueError, match="restore_hold_s"):
        ov.OverloadConfig(restore_hold_s=-1.0)
