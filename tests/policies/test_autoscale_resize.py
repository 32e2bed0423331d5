"""The autoscaler resizing an auto layout's plan (issue 32, `policies/scaling/autoscale.py`): it
grows the plan when every planned replica is awake and the queue wants more (up to
`max`, a growth still loading counted), shrinks it instead of sleeping a replica whose
host cache has no room (down to max(1, min), one resize at a time), never resizes an
explicit layout, and keeps the scale-in hysteresis; `plan_cap` reads the count back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.policies.scaling import autoscale as a

CFG = a.AutoscaleConfig(
    enabled=True,
    min_replicas=1,
    max_replicas=3,
    queue_per_replica=1,
    scale_down_after_s=5,
    up_cooldown_s=2,
)


def rep(rid: str, awake: bool = True, room: bool = False, **kw: float) -> a.ReplicaLoad:
    return a.ReplicaLoad(rid, awake, cache_room=room, **kw)  # type: ignore[arg-type]


def sig(*reps: a.ReplicaLoad, now: float = 100.0, **kw: object) -> a.Signals:
    kw.setdefault("resizable", True)
    return a.Signals(tuple(reps), now, **kw)  # type: ignore[arg-type]


def test_grows_the_plan_when_every_replica_is_awake_and_busy() -> None:
    d = a.decide(sig(rep("r0", running=1, waiting=3), planned=1), CFG, a.Memory())
    assert d.reason == a.OUT and d.replicas == 3 and d.wake == ()  # the queue's 4, max 3
    assert d.memory.last_up_at == 100.0
    # within the cooldown nothing more is asked
    again = a.decide(sig(rep("r0", running=1, waiting=3), planned=1, now=101), CFG, d.memory)
    assert again.reason == a.COOLDOWN and again.replicas is None


def test_wakes_a_sleeper_before_growing_and_grows_for_the_rest() -> None:
    s = sig(rep("r0", running=1, waiting=2), rep("r1", awake=False), planned=2)
    d = a.decide(s, CFG, a.Memory())
    assert d.wake == ("r1",) and d.replicas is None  # 2 wanted: the sleeper covers it
    s = sig(rep("r0", running=1, waiting=3), rep("r1", awake=False), planned=2)
    d = a.decide(s, CFG, a.Memory())
    assert d.wake == ("r1",) and d.replicas == 3


def test_a_growth_still_loading_counts_and_max_bounds_it() -> None:
    # asked for 2; the new replica is in the plan but not loaded: no second growth
    s = sig(rep("r0", running=1, waiting=1), planned=2, target=2)
    assert a.decide(s, CFG, a.Memory()).replicas is None
    # at max: no growth, the reason says so
    s = sig(*(rep(f"r{i}", running=1, waiting=2) for i in range(3)), planned=3)
    d = a.decide(s, CFG, a.Memory())
    assert d.reason == a.CAP and d.replicas is None


def test_explicit_layouts_and_no_max_only_wake_and_sleep() -> None:
    s = sig(rep("r0", running=1, waiting=3), planned=1, resizable=False)
    assert a.decide(s, CFG, a.Memory()).replicas is None
    no_max = a.AutoscaleConfig(enabled=True, max_replicas=0, queue_per_replica=1)
    assert a.decide(sig(rep("r0", waiting=3), planned=1), no_max, a.Memory()).replicas is None


def test_calm_shrinks_the_plan_when_the_host_cache_has_no_room() -> None:
    s = sig(rep("r0"), rep("r1"), planned=2, now=0.0)
    mem = a.decide(s, CFG, a.Memory()).memory  # the calm window starts
    d = a.decide(sig(rep("r0"), rep("r1"), planned=2, now=6.0), CFG, mem)
    assert d.reason == a.IN and d.replicas == 1 and d.sleep == ()
    # until the plan follows, nothing else stops (the shrink is pending)
    s = sig(rep("r0"), rep("r1"), planned=2, target=1, now=20.0)
    d2 = a.decide(s, CFG, d.memory)
    assert d2.replicas is None and d2.sleep == ()
    # never below max(1, min)
    d3 = a.decide(sig(rep("r0"), planned=1, target=1, now=30.0), CFG, d.memory)
    assert not d3.acted


def test_prefers_sleeping_when_the_host_cache_has_room() -> None:
    s = sig(rep("r0", room=True), rep("r1", room=True), planned=2, now=0.0)
    mem = a.decide(s, CFG, a.Memory()).memory
    s = sig(rep("r0", room=True), rep("r1", room=True), planned=2, now=6.0)
    d = a.decide(s, CFG, mem)
    assert d.reason == a.IN and d.replicas is None and len(d.sleep) == 1


def test_calm_window_is_the_hysteresis_for_shrinking() -> None:
    s = sig(rep("r0"), rep("r1"), planned=2, now=0.0)
    mem = a.decide(s, CFG, a.Memory()).memory
    assert not a.decide(sig(rep("r0"), rep("r1"), planned=2, now=4.0), CFG, mem).acted
    # a queue resets the window
    busy = a.decide(sig(rep("r0", waiting=1), rep("r1"), planned=2, now=4.5), CFG, mem)
    assert busy.memory.calm_since is None
    assert not a.decide(sig(rep("r0"), rep("r1"), planned=2, now=6.0), CFG, busy.memory).acted


def test_plan_cap_reads_the_status_for_auto_layouts_only() -> None:
    assert a.plan_cap(True, "auto", {"desiredReplicas": 2}) == 2
    assert a.plan_cap(True, "explicit", {"desiredReplicas": 2}) is None
    assert a.plan_cap(False, "auto", {"desiredReplicas": 2}) is None
    assert a.plan_cap(True, "auto", {}) is None and a.plan_cap(True, "auto", None) is None
    assert a.plan_cap(True, "auto", {"desiredReplicas": 3}, maximum=2) == 2  # max lowered


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 4), st.integers(0, 4), st.booleans()),
        min_size=1,
        max_size=4,
    ),
    st.integers(0, 3),
    st.integers(0, 9),
    st.one_of(st.none(), st.integers(1, 5)),
    st.floats(0, 50),
)
def test_resizes_stay_in_bounds_and_never_stop_a_busy_replica(
    loads: list[tuple[bool, int, int, bool]],
    extra: int,
    held: int,
    target: int | None,
    calm_since: float,
) -> None:
    reps = [
        rep(f"r{i}", aw, room, running=ru, waiting=wa) for i, (aw, ru, wa, room) in enumerate(loads)
    ]
    s = sig(*reps, planned=len(reps) + extra, target=target, held=held, now=60.0)
    d = a.decide(s, CFG, a.Memory(calm_since=calm_since))
    if d.replicas is not None:
        assert max(1, CFG.min_replicas) <= d.replicas <= CFG.max_replicas
        assert d.replicas != s.plan_count or target not in (None, s.plan_count)
        if d.replicas < s.plan_count:
            assert not s.shrinking
    by_id = {r.replica_id: r for r in reps}
    assert all(by_id[r].empty and by_id[r].awake for r in d.sleep)
    assert all(not by_id[r].awake for r in d.wake)
