"""The replica autoscaler's pure decision (issue 32, `policies/scaling/autoscale.py`): from zero at
once, out on queue / KV / TTFT with a cooldown, idle replicas sleep (to zero with min 0),
in only after the calm window, bounds, and never a busy replica put to sleep."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.policies.scaling import autoscale as a

CFG = a.AutoscaleConfig(
    enabled=True, min_replicas=0, max_replicas=4, sleep_after_s=10, scale_down_after_s=20
)


def rep(rid: str, awake: bool = True, **kw: float) -> a.ReplicaLoad:
    return a.ReplicaLoad(rid, awake, **kw)  # type: ignore[arg-type]


def sig(*reps: a.ReplicaLoad, now: float = 100.0, **kw: object) -> a.Signals:
    return a.Signals(tuple(reps), now, **kw)  # type: ignore[arg-type]


def test_from_zero_wakes_enough_for_the_held_queue_at_once() -> None:
    s = sig(*(rep(f"r{i}", awake=False) for i in range(4)), held=9)
    mem = a.Memory(last_up_at=99.9)  # a cooldown does not hold back the first replica
    d = a.decide(s, CFG, mem)
    assert d.reason == a.FROM_ZERO and d.wake == ("r0", "r1", "r2") and d.desired == 3
    assert d.memory.last_up_at == 100.0


def test_no_demand_at_zero_stays_asleep() -> None:
    d = a.decide(sig(rep("r0", awake=False)), CFG, a.Memory())
    assert d.desired == 0 and not d.acted


@pytest.mark.parametrize(
    ("load", "signal", "why"),
    [
        ({"waiting": 9}, {}, "waiting"),
        ({"kv_used": 0.95}, {}, "KV use"),
        ({"kv_used": 0.5}, {"ttft_p99_s": 2.0}, "TTFT"),
    ],
)
def test_out_on_each_signal_then_cooldown(
    load: dict[str, float], signal: dict[str, float], why: str
) -> None:
    cfg = a.AutoscaleConfig(min_replicas=1, max_replicas=3, ttft_slo_s=1.0, up_cooldown_s=5)
    s = sig(rep("r0", **load), rep("r1", awake=False), rep("r2", awake=False), **signal)
    d = a.decide(s, cfg, a.Memory())
    assert d.reason == a.OUT and d.wake[0] == "r1" and why in d.message
    again = a.decide(sig(*s.replicas, now=102.0, **signal), cfg, d.memory)
    assert again.reason == a.COOLDOWN and not again.acted


def test_idle_replicas_sleep_down_to_zero_but_never_a_busy_one() -> None:
    s = sig(rep("r0", idle_s=30), rep("r1", idle_s=5), rep("r2", running=1))
    d = a.decide(s, CFG, a.Memory())
    assert d.reason == a.IDLE and d.sleep == ("r0",)
    all_idle = sig(rep("r0", idle_s=30), rep("r1", idle_s=12))
    z = a.decide(all_idle, CFG, a.Memory())
    assert z.reason == a.TO_ZERO and set(z.sleep) == {"r0", "r1"} and z.desired == 0


def test_min_keeps_one_awake() -> None:
    cfg = a.AutoscaleConfig(min_replicas=1, sleep_after_s=10)
    d = a.decide(sig(rep("r0", idle_s=30), rep("r1", idle_s=40)), cfg, a.Memory())
    assert d.sleep == ("r1",) and d.desired == 1
    floor = a.decide(sig(rep("r0", awake=False), rep("r1", awake=False)), cfg, a.Memory())
    assert floor.reason == a.FLOOR and floor.wake == ("r0",)


def test_in_only_after_the_calm_window() -> None:
    cfg = a.AutoscaleConfig(min_replicas=1, scale_down_after_s=20)  # no idle sleep
    s = sig(rep("r0", kv_used=0.1, running=1), rep("r1", kv_used=0.1), now=100.0)
    d = a.decide(s, cfg, a.Memory())
    assert d.reason == a.STEADY and d.memory.calm_since == 100.0
    later = a.decide(sig(*s.replicas, now=121.0), cfg, d.memory)
    assert later.reason == a.IN and later.sleep == ("r1",)
    busy = sig(rep("r0", kv_used=0.5), rep("r1", kv_used=0.5), now=121.0)
    assert a.decide(busy, cfg, d.memory).memory.calm_since is None  # hysteresis reset


def test_max_caps_a_scale_out() -> None:
    cfg = a.AutoscaleConfig(max_replicas=1)
    d = a.decide(sig(rep("r0", waiting=50), rep("r1", awake=False)), cfg, a.Memory())
    assert d.reason == a.CAP and not d.acted


@settings(max_examples=300, deadline=None)
@given(
    awake=st.lists(st.booleans(), min_size=1, max_size=6),
    running=st.lists(st.integers(0, 3), min_size=6, max_size=6),
    waiting=st.lists(st.integers(0, 9), min_size=6, max_size=6),
    kv=st.lists(st.floats(0, 1), min_size=6, max_size=6),
    idle=st.lists(st.floats(0, 100), min_size=6, max_size=6),
    held=st.integers(0, 20),
    lo=st.integers(0, 3),
    hi=st.integers(0, 6),
    now=st.floats(0, 1000),
)
def test_properties(
    awake: list[bool],
    running: list[int],
    waiting: list[int],
    kv: list[float],
    idle: list[float],
    held: int,
    lo: int,
    hi: int,
    now: float,
) -> None:
    hi = 0 if hi == 0 else max(hi, lo)
    cfg = a.AutoscaleConfig(min_replicas=lo, max_replicas=hi, sleep_after_s=10, up_cooldown_s=0)
    reps = tuple(
        a.ReplicaLoad(f"r{i}", w, running[i], waiting[i] if w else 0, kv[i], idle[i])
        for i, w in enumerate(awake)
    )
    s = a.Signals(reps, now, held=held)
    d = a.decide(s, cfg, a.Memory())
    by = {r.replica_id: r for r in reps}
    assert all(by[r].awake and by[r].empty for r in d.sleep)  # never a busy one
    assert all(not by[r].awake for r in d.wake) and not set(d.wake) & set(d.sleep)
    assert d.desired == d.awake + len(d.wake) - len(d.sleep)
    cap = min(hi or len(reps), len(reps))
    n = sum(awake)
    if min(lo, cap) <= n <= cap:
        assert min(lo, cap) <= d.desired <= cap
    if n == 0 and held:
        assert d.desired >= 1  # demand from zero always wakes one
    if held and n and n <= cap:
        assert not d.sleep  # no scale-in while requests wait (only above the max)
