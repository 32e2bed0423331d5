"""KunServe drop plan (Figure 6): the paper's cases, edge cases and stage balancing."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.policies.overload import drop_plan as dp

L = 8  # layers
LAYER = 100  # bytes per layer
P = L * LAYER  # parameter bytes of one whole replica


def whole(n: int, required: int, **kw: object) -> dp.DropInput:
    reps = tuple(dp.Replica(f"r{i}", frozenset(range(L))) for i in range(n))
    return dp.DropInput(reps, (LAYER,) * L, required, **kw)  # type: ignore[arg-type]


def changed(plan: dp.DropPlan) -> list[dp.Group]:
    return [g for g in plan.groups if g.changed]


def test_paper_r_1_5p_gives_two_2_stage_groups_freeing_2p() -> None:
    plan = dp.plan_drop(whole(4, int(1.5 * P)))
    assert not plan.fallback and plan.reason == dp.REASON_DROP
    assert plan.freed_bytes == 2 * P
    groups = changed(plan)
    assert [len(g.members) for g in groups] == [2, 2]
    assert all(len(g.stages) == 2 and g.freed_bytes == P for g in groups)
    assert {m for g in groups for m in g.members} == {"r0", "r1", "r2", "r3"}
    # each member keeps half the model and frees the other half
    assert plan.freed_by_replica == {f"r{i}": P // 2 for i in range(4)}


def test_paper_r_2_5p_gives_one_4_stage_group_freeing_3p() -> None:
    plan = dp.plan_drop(whole(4, int(2.5 * P)))
    assert not plan.fallback and plan.freed_bytes == 3 * P
    (group,) = plan.groups
    assert len(group.members) == 4 and len(group.stages) == 4
    assert [(s.start, s.end) for s in group.stages] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert sorted(plan.freed_by_replica.values()) == [3 * P // 4] * 4
    assert plan.merges == 3


def test_smallest_groups_merge_first_leaving_others_whole() -> None:
    plan = dp.plan_drop(whole(5, int(1.5 * P)))
    sizes = sorted(len(g.members) for g in plan.groups)
    assert sizes == [1, 2, 2]
    (alone,) = [g for g in plan.groups if len(g.members) == 1]
    assert not alone.changed and alone.stages == (dp.Stage(alone.members[0], 0, L),)


def test_one_replica_cannot_drop() -> None:
    plan = dp.plan_drop(whole(1, P))
    assert plan.fallback and plan.reason == dp.REASON_UNREACHABLE
    assert plan.freed_bytes == 0 and "scale out" in plan.message


def test_r_zero_needs_no_plan() -> None:
    plan = dp.plan_drop(whole(4, 0))
    assert not plan.fallback and plan.reason == dp.REASON_NOTHING
    assert plan.freed_bytes == 0 and not changed(plan) and len(plan.groups) == 4


def test_r_unreachable_falls_back_and_changes_nothing() -> None:
    plan = dp.plan_drop(whole(4, 3 * P + 1))  # 4 replicas free at most 3P
    assert plan.fallback and plan.reason == dp.REASON_UNREACHABLE
    assert f"frees {3 * P} bytes" in plan.message and "scale out" in plan.message
    assert not changed(plan) and plan.freed_by_replica == {}


def test_groups_never_outnumber_their_layers() -> None:
    """A 4-layer model pipelines at most 4 ways: 16 replicas form four 4-member groups
    at most, freeing 12 copies; more cannot be had."""
    reps = tuple(dp.Replica(f"r{i}", frozenset(range(4))) for i in range(16))
    p4 = 4 * LAYER
    plan = dp.plan_drop(dp.DropInput(reps, (LAYER,) * 4, 12 * p4))
    assert not plan.fallback and sorted(len(g.members) for g in plan.groups) == [4] * 4
    assert all(len(g.stages) == 4 for g in plan.groups)
    plan = dp.plan_drop(dp.DropInput(reps, (LAYER,) * 4, 12 * p4 + 1))
    assert plan.fallback and f"frees {12 * p4} bytes" in plan.message


def test_existing_groups_count_only_duplicated_layers() -> None:
    """Two 2-stage pipelines (each holding one copy) merge into one 4-stage pipeline;
    the stages go to members that already hold them (drop only, never load)."""
    half0, half1 = frozenset(range(L // 2)), frozenset(range(L // 2, L))
    reps = (
        dp.Replica("a", half0),
        dp.Replica("b", half1),
        dp.Replica("c", half0),
        dp.Replica("d", half1),
    )
    inp = dp.DropInput(reps, (LAYER,) * L, 1, groups=(("a", "b"), ("c", "d")))
    plan = dp.plan_drop(inp)
    assert plan.freed_bytes == P
    (g,) = plan.groups
    for s in g.stages:
        assert set(range(s.start, s.end)) <= next(r.layers for r in reps if r.name == s.replica)
    assert sorted((s.start, s.end) for s in g.stages) == [(0, 2), (2, 4), (4, 6), (6, 8)]


def test_cost_balancing_moves_a_layer_off_the_lm_head_stage() -> None:
    plan = dp.plan_drop(whole(2, 1, last_extra_cost=2.0))
    (g,) = changed(plan)
    assert [(s.start, s.end) for s in g.stages] == [(0, 5), (5, 8)]  # 5 vs 3 + 2


def test_balanced_cuts_is_optimal_on_uneven_costs() -> None:
    assert dp.balanced_cuts([1, 1, 1, 1, 4], 2) == [(0, 4), (4, 5)]
    with pytest.raises(ValueError):
        dp.balanced_cuts([1.0], 2)


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        dp.DropInput((dp.Replica("a", frozenset({0})),) * 2, (1,), 1)
    with pytest.raises(ValueError, match="layers must lie"):
        dp.DropInput((dp.Replica("a", frozenset({3})),), (1,), 1)
    with pytest.raises(ValueError, match="every replica"):
        dp.DropInput((dp.Replica("a", frozenset({0})),), (1,), 1, groups=(("b",),))


@given(costs=st.lists(st.integers(1, 9), min_size=1, max_size=8), k=st.integers(1, 8))
def test_balanced_cuts_matches_brute_force(costs: list[int], k: int) -> None:
    if k > len(costs):
        return
    parts = dp.balanced_cuts([float(c) for c in costs], k)
    assert parts[0][0] == 0 and parts[-1][1] == len(costs) and len(parts) == k
    assert all(a < b for a, b in parts) and all(p[1] == q[0] for p, q in itertools.pairwise(parts))
    best = min(
        max(sum(costs[a:b]) for a, b in zip((0, *cuts), (*cuts, len(costs)), strict=False))
        for cuts in itertools.combinations(range(1, len(costs)), k - 1)
    )
    assert max(sum(costs[a:b]) for a, b in parts) == best


@given(n=st.integers(1, L), r_layers=st.integers(0, L * L))
def test_plan_frees_enough_with_fewest_merges(n: int, r_layers: int) -> None:
    """Whole replicas (no more than layers, so groups are never capped): each merge frees
    P, so the plan uses ceil(R/P) merges or falls back."""
    required = r_layers * LAYER
    plan = dp.plan_drop(whole(n, required))
    need = -(-required // P)
    if required == 0:
        assert plan.merges == 0 and not plan.fallback
    elif need <= n - 1:
        assert not plan.fallback and plan.merges == need and plan.freed_bytes == need * P
        assert sum(plan.freed_by_replica.values()) == plan.freed_bytes
        for g in changed(plan):  # every group still covers every layer exactly once
            covered = sorted(i for s in g.stages for i in range(s.start, s.end))
            assert covered == list(range(L))
        sizes = [len(g.members) for g in plan.groups]
        assert max(sizes) - min(sizes) <= max(sizes) // 2 + 1  # smallest-first keeps them even
    else:
        assert plan.fallback
