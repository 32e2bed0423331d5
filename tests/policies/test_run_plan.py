"""Module-scaling decisions as layer-run operations (`policies/scaling/run_plan.py`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tessera.policies.scaling import module_scaling as ms
from tessera.policies.scaling import run_plan
from tessera.policies.scaling import speedup as sp


def test_runs_of_consecutive_layers() -> None:
    assert run_plan.runs_of([5, 0, 1, 2, 7, 6]) == [(0, 3), (5, 8)]
    assert run_plan.runs_of([]) == []


@given(st.dictionaries(st.sampled_from("abcd"), st.sets(st.integers(0, 15), min_size=1)))
def test_aligned_runs_are_equal_or_disjoint_and_cover_the_layers(
    by_device: dict[str, set[int]],
) -> None:
    out = run_plan.aligned_runs(by_device)
    for d, runs in out.items():
        assert sorted(i for s, e in runs for i in range(s, e)) == sorted(by_device[d])
    every = {r for rs in out.values() for r in rs}
    for a in every:
        for b in every:
            assert a == b or a[1] <= b[0] or b[1] <= a[0]


def test_algorithm1_plan_becomes_run_replications() -> None:
    """Scale-up on two idle devices: the layers each takes become runs, cut to align."""
    devices = {
        "g0": sp.Device("g0", 1.0, free_bytes=0, idle_fraction=0.0),
        "g1": sp.Device("g1", 1.0, free_bytes=3 * 100, idle_fraction=0.9),
        "g2": sp.Device("g2", 1.0, free_bytes=5 * 100, idle_fraction=0.8),
    }
    plan = ms.scale_up(
        sp.Placement.initial("g0", 8),
        devices,
        sp.Workload(hidden=4096, batch=16, seq_len=1),
        100,
        ms.ScalingConfig(enabled=True),
    )
    ops = run_plan.replicate_ops(plan.actions)
    assert ops and all(o.op == "replicate" for o in ops)
    taken = {(o.target, i) for o in ops for i in range(o.start, o.end)}
    assert taken == {(a.device, a.layer) for a in plan.actions}
    spans = {(o.start, o.end) for o in ops}
    assert all(a == b or a[1] <= b[0] or b[1] <= a[0] for a in spans for b in spans)


def test_scale_down_ops_keep_the_phase_order() -> None:
    plan = ms.ScaleDownPlan(
        (
            ms.Migrate("layers.4-6", "g0", "g1", 10),
            ms.Evict("r1", 2, "g0", 0.1),
            ms.Evict("r1", 3, "g0", 0.1),
            ms.ReduceBatch(20, 15),
        ),
        "reduce",
        True,
        0.01,
        15,
        "",
    )
    ops = run_plan.scale_down_ops(plan, {"layers.4-6": (4, 6)})
    assert [o.op for o in ops] == ["migrate", "evict", "reduce_batch"]
    assert (ops[0].start, ops[0].end, ops[0].holder, ops[0].target) == (4, 6, "g0", "g1")
    assert (ops[1].start, ops[1].end, ops[1].holder) == (2, 4, "g0")
    assert ops[2].batch == 15
