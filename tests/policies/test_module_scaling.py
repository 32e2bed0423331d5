"""CoCoServe speedup model, Algorithms 1-2 and the sticky split: the paper's cases."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.policies.scaling import module_scaling as ms
from tessera.policies.scaling import request_split as rs
from tessera.policies.scaling import speedup as sp

WL = sp.Workload(hidden=64, batch=16, seq_len=128, delta=1.0)
MB = 1 << 20


def devs(*ds: sp.Device) -> dict[str, sp.Device]:
    return {d.name: d for d in ds}


def homo(
    bandwidth: float, n_extra: int = 3, free: int = 100 * MB, idle: float = 0.9
) -> dict[str, sp.Device]:
    out = [sp.Device("g0", 1.0, bandwidth)]
    out += [sp.Device(f"g{i}", 1.0, bandwidth, free, idle) for i in range(1, n_extra + 1)]
    return devs(*out)


def test_initial_state_has_speedup_one() -> None:
    assert sp.speedup(sp.Placement.initial("g0", 8), homo(1e3), WL) == pytest.approx(1.0)
    assert sp.speedup_homogeneous([1] * 8, 0.3) == pytest.approx(1.0)


@pytest.mark.parametrize("reps", [[1, 1, 1, 1], [2, 2, 1, 1], [3, 1, 2, 4], [4, 4, 4, 4]])
def test_eq3_reduces_to_eq4_on_identical_devices(reps: list[int]) -> None:
    """The paper's derivation: even split on identical devices, gamma = delta*C/(d*B)."""
    bw = 2000.0
    d = homo(bw)
    state = sp.Placement("g0", tuple(tuple(f"g{j}" for j in range(1, p)) for p in reps))
    gamma = WL.delta * 1.0 / (WL.hidden * bw)
    assert state.degrees == tuple(reps)
    assert sp.speedup(state, d, WL) == pytest.approx(sp.speedup_homogeneous(reps, gamma))


def test_eq4_is_amdahl_when_every_layer_has_the_same_degree() -> None:
    gamma, p = 0.2, 4
    a = 1 - gamma
    assert sp.speedup_homogeneous([p] * 10, gamma) == pytest.approx(1 / ((1 - a) + a / p))


def test_speedup_grows_with_replicated_layers_and_degree() -> None:
    """§4.1: positively correlated with the number of modules and the degree (Fig. 6)."""
    g = 0.05
    by_layers = [sp.speedup_homogeneous([2] * k + [1] * (40 - k), g) for k in (0, 10, 20, 30, 40)]
    by_degree = [sp.speedup_homogeneous([p] * 20 + [1] * 20, g) for p in (1, 2, 3, 4)]
    assert by_layers == sorted(by_layers) and by_degree == sorted(by_degree)


def test_gamma_from_profiled_times() -> None:
    assert sp.gamma_from_times(layer_compute_s=2e-3, activation_transfer_s=1e-4) == pytest.approx(
        0.05
    )
    with pytest.raises(ValueError):
        sp.gamma_from_times(0.0, 1.0)


def test_table2_memory_is_linear_and_bounds_replicas() -> None:
    """Table 2 (LLaMA-13B): 1107, 6579, 12659, 18739, 24819 MB for 1, 10, 20, 30, 40
    layers: 608 MB per layer plus 499 MB fixed. A device with the 20-layer footprint free
    (fixed part reserved) takes 20 replicas of r = 608 MB, and Algorithm 1 adds no more."""
    table = {1: 1107, 10: 6579, 20: 12659, 30: 18739, 40: 24819}
    per_layer = (table[40] - table[1]) / 39
    assert per_layer == 608 and all(table[k] == 499 + 608 * k for k in table)
    d = devs(sp.Device("g0", 1.0, 1e9), sp.Device("g1", 1.0, 1e9, (12659 - 499) * MB, 0.9))
    plan = ms.scale_up(sp.Placement.initial("g0", 40), d, WL, 608 * MB, ms.ScalingConfig())
    assert len(plan.actions) == 20
    assert [a.layer for a in plan.actions] == list(range(20))  # continuity, then index


def test_section_3_1_split_of_15_requests_is_8_and_7() -> None:
    assert ms.batch_split_counts([1.0, 1.0], 15) == [8, 7]
    split = rs.assign(["g0", "g1"], {"g0": 1.0, "g1": 1.0}, {}, [f"q{i}" for i in range(15)])
    assert split.counts() == {"g0": 8, "g1": 7}
    assert ms.batch_split_counts([2.0, 1.0], 9) == [6, 3]


def test_split_is_sticky_and_evicted_holders_hand_back() -> None:
    speeds = {"g0": 1.0, "g1": 1.0}
    s1 = rs.assign(["g0", "g1"], speeds, {}, ["a", "b", "c", "d"])
    s2 = rs.assign(["g0", "g1"], speeds, s1.assignment, ["e", "f"], left=["a", "c"])
    for r in ("b", "d"):
        assert s2.assignment[r] == s1.assignment[r]  # running requests never move
    assert "a" not in s2.assignment and set(s2.counts().values()) == {2}
    s3 = rs.assign(["g0"], {"g0": 1.0}, s2.assignment)  # g1 evicted
    assert set(s3.assignment.values()) == {"g0"} and len(s3.assignment) == 4
    with pytest.raises(ValueError):
        rs.assign(["g0", "g1"], {"g0": 1.0}, {})


def test_scale_up_skips_busy_devices_and_respects_memory() -> None:
    d = devs(
        sp.Device("g0", 1.0),
        sp.Device("busy", 1.0, 1e9, 100 * MB, 0.3),  # below up_idle_fraction
        sp.Device("small", 1.0, 1e9, 3 * MB, 0.8),
    )
    plan = ms.scale_up(sp.Placement.initial("g0", 8), d, WL, MB, ms.ScalingConfig())
    assert {a.device for a in plan.actions} == {"small"} and len(plan.actions) == 3
    assert plan.speedup_after > plan.speedup_before


def test_scale_up_rejects_a_slow_far_replica() -> None:
    """Heterogeneous form: a replica that costs more transfer than it saves is not added."""
    d = devs(sp.Device("g0", 4.0), sp.Device("slow", 0.25, 1e-3, 100 * MB, 1.0))
    plan = ms.scale_up(sp.Placement.initial("g0", 4), d, WL, MB, ms.ScalingConfig())
    assert plan.actions == () and plan.speedup_after == plan.speedup_before == 1.0


def test_continuity_extends_existing_runs_first() -> None:
    state = sp.Placement.initial("g0", 10).add(4, "g1").add(5, "g1")
    assert ms.candidates_by_continuity(state, "g1", 3) == [3, 2, 1]  # grows the run down
    state2 = sp.Placement.initial("g0", 10).add(0, "g1")
    assert ms.candidates_by_continuity(state2, "g1", 2) == [1, 2]


@settings(max_examples=60, deadline=None)
@given(
    caps=st.lists(st.floats(0.1, 4.0), min_size=1, max_size=4),
    bws=st.lists(st.floats(1.0, 1e6), min_size=4, max_size=4),
    idles=st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4),
    frees=st.lists(st.integers(0, 12), min_size=4, max_size=4),
    layers=st.integers(1, 12),
)
def test_scale_up_never_decreases_speedup(
    caps: list[float], bws: list[float], idles: list[float], frees: list[int], layers: int
) -> None:
    d = {"g0": sp.Device("g0", 1.0)}
    for i, c in enumerate(caps):
        d[f"g{i + 1}"] = sp.Device(f"g{i + 1}", c, bws[i], frees[i] * MB, idles[i])
    plan = ms.scale_up(sp.Placement.initial("g0", layers), d, WL, MB, ms.ScalingConfig())
    speeds = [plan.speedup_before] + [a.speedup for a in plan.actions]
    assert all(b > a for a, b in itertools.pairwise(speeds))
    assert plan.speedup_after == pytest.approx(sp.speedup(plan.state, d, WL))
    for name, dev in d.items():
        placed = len(plan.state.on(name))
        assert placed * MB <= dev.free_bytes or placed == 0
        if placed:
            assert dev.idle_fraction > 0.5


def _down(step_s: float, **kw: object) -> ms.ScaleDownInput:
    base: dict[str, object] = dict(
        source="g0",
        violation_rate=0.2,
        step_seconds=step_s,
        step_budget_s=0.050,
        modules=(ms.Module("layer3", 10 * MB, 0.010), ms.Module("layer4", 10 * MB, 0.008)),
        hosted=(ms.Hosted("other", 1, 0.006), ms.Hosted("other", 2, 0.006)),
        owners={"other": (sp.Placement("gX", ((), ("g0",), ("g0",), ())), WL)},
        batch_size=20,
        fixed_seconds=0.010,
    )
    base.update(kw)
    return ms.ScaleDownInput(**base)  # type: ignore[arg-type]


DOWN_DEVS = devs(
    sp.Device("g0", 1.0), sp.Device("gX", 1.0), sp.Device("g1", 1.0, 1e9, 100 * MB, 0.9)
)


def test_scale_down_waits_for_the_violation_threshold() -> None:
    plan = ms.scale_down(_down(0.2, violation_rate=0.04), DOWN_DEVS, ms.ScalingConfig())
    assert plan.actions == () and plan.phase == "none"


def test_scale_down_migrates_first_and_stops_when_resolved() -> None:
    plan = ms.scale_down(_down(0.058), DOWN_DEVS, ms.ScalingConfig())
    assert [type(a) for a in plan.actions] == [ms.Migrate]
    assert plan.actions[0] == ms.Migrate("layer3", "g0", "g1", 10 * MB)  # heaviest first
    assert plan.resolved and plan.phase == "migrate"


def test_scale_down_phase_order_migrate_evict_reduce() -> None:
    plan = ms.scale_down(_down(0.074), DOWN_DEVS, ms.ScalingConfig())
    kinds = [type(a) for a in plan.actions]
    assert kinds == [ms.Migrate, ms.Migrate, ms.Evict] and plan.phase == "evict"
    plan = ms.scale_down(_down(0.200), DOWN_DEVS, ms.ScalingConfig())
    kinds = [type(a) for a in plan.actions]
    first_reduce = kinds.index(ms.ReduceBatch)
    assert kinds[:first_reduce] == [ms.Migrate, ms.Migrate, ms.Evict, ms.Evict]
    assert all(k is ms.ReduceBatch for k in kinds[first_reduce:])
    assert plan.actions[first_reduce] == ms.ReduceBatch(20, 15)  # batch_step 5
    assert plan.phase == "reduce" and plan.resolved and plan.step_seconds <= 0.050


def test_scale_down_evicts_least_speedup_lost_first() -> None:
    """`other` has layers 1 and 2 replicated on g0, and layer 2 also on g1: evicting
    layer 2's g0 replica loses less (it keeps a second holder) than layer 1's."""
    owner = sp.Placement("gX", ((), ("g0",), ("g0", "g1"), ()))
    inp = _down(0.074, owners={"other": (owner, WL)}, modules=())
    plan = ms.scale_down(inp, DOWN_DEVS, ms.ScalingConfig())
    evicts = [a for a in plan.actions if isinstance(a, ms.Evict)]
    assert [e.layer for e in evicts] == [2, 1]
    assert evicts[0].speedup_lost < evicts[1].speedup_lost


def test_scale_down_reports_unresolved_at_batch_one() -> None:
    inp = _down(2.0, fixed_seconds=1.0, batch_size=6)
    plan = ms.scale_down(inp, DOWN_DEVS, ms.ScalingConfig())
    assert not plan.resolved and plan.batch_size == 1 and "still violating" in plan.reason


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="up_idle_fraction"):
        ms.ScalingConfig(up_idle_fraction=1.0)
    with pytest.raises(ValueError, match="batch_step"):
        ms.ScalingConfig(batch_step=0)
