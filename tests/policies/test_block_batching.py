"""Per-block batching (pure): which pending steps share a co-step, each instance's passes
within its batch limit, fairness (a passed-over step goes first), and the linger rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.policies.serving import block_batching as bb


def _step(
    key: int,
    chain: str,
    rows: int,
    pieces: list[str],
    waited: int = 0,
    final: str | None = None,
) -> bb.PendingStep:
    uses = [bb.Use(i, f"layer.{i}", p) for i, p in enumerate(pieces)]
    if final is not None:
        uses.append(bb.Use(len(pieces), "final", final))
    return bb.PendingStep(key, chain, rows, tuple(uses), waited, key)


BASE = ["L0", "L1", "L2", "L3"]
FT = ["L0", "F1", "L2", "L3"]  # a fine-tune differing in layer 1


def test_shared_instances_get_one_pass_and_own_layers_their_own() -> None:
    plan = bb.plan(
        [_step(0, "base", 3, BASE, final="H"), _step(1, "ft", 2, FT, final="H")], bb.BatchLimits()
    )
    assert plan.steps == (0, 1) and plan.waiting == () and plan.shared
    by_slot = {(p.slot, p.piece): p for p in plan.passes}
    assert by_slot[(0, "L0")].steps == (0, 1) and by_slot[(0, "L0")].rows == 5
    assert by_slot[(1, "L1")].steps == (0,) and by_slot[(1, "F1")].steps == (1,)
    assert by_slot[(4, "H")].steps == (0, 1)
    assert [p.slot for p in plan.passes] == sorted(p.slot for p in plan.passes)


def test_batch_limit_defers_what_does_not_fit_and_the_deferred_go_first() -> None:
    limits = bb.BatchLimits(rows_per_pass=8)
    pending = [_step(0, "a", 6, BASE), _step(1, "b", 6, FT), _step(2, "c", 2, FT)]
    plan = bb.plan(pending, limits)
    assert plan.steps == (0, 2) and plan.waiting == (1,)  # 6 + 6 > 8; 6 + 2 fits
    assert all(p.rows <= 8 for p in plan.passes)
    # next time the passed-over step leads, ahead of a newer one
    again = bb.plan([_step(1, "b", 6, FT, waited=1), _step(3, "a", 6, BASE)], limits)
    assert again.steps == (1,) and again.waiting == (3,)


def test_per_label_limit() -> None:
    limits = bb.BatchLimits(rows_per_pass=100, per_label=(("final", 4),))
    assert limits.limit("final") == 4 and limits.limit("layer.0") == 100
    pending = [_step(0, "a", 3, BASE, final="H"), _step(1, "b", 3, BASE, final="H")]
    assert bb.plan(pending, limits).steps == (0,)


def test_oversized_head_runs_alone_and_one_step_per_chain() -> None:
    limits = bb.BatchLimits(rows_per_pass=4)
    plan = bb.plan([_step(0, "a", 9, BASE), _step(1, "b", 1, BASE)], limits)
    assert plan.steps == (0,) and not plan.shared
    plan = bb.plan([_step(0, "a", 1, BASE), _step(1, "a", 1, BASE)], bb.BatchLimits())
    assert plan.steps == (0,)  # the same chain's second microbatch waits


def test_unshared_and_unbatchable_steps_wait() -> None:
    other = ["X0", "X1", "X2", "X3"]
    plan = bb.plan(
        [_step(0, "a", 1, BASE), _step(1, "z", 1, other), _step(2, "t", 1, [])], bb.BatchLimits()
    )
    assert plan.steps == (0,) and set(plan.waiting) == {1, 2}


def test_connected_through_a_later_step() -> None:
    # c shares only with b, b only with a: c joins once b has
    a, b, c = ["P", "Q"], ["P", "R"], ["S", "R"]
    plan = bb.plan(
        [_step(0, "a", 1, a), _step(1, "c", 1, c), _step(2, "b", 1, b)], bb.BatchLimits()
    )
    assert set(plan.steps) == {0, 1, 2}


def test_expected_partners_and_linger() -> None:
    lim = bb.BatchLimits(linger_s=0.002, recent_s=0.1)
    head = frozenset({"L0", "L1"})
    peers = [
        bb.Peer("b", frozenset({"L1", "X"}), 0.001, True),  # shares L1, busy: expected
        bb.Peer("c", frozenset({"L1"}), 0.001, False),  # no work left: not coming
        bb.Peer("d", frozenset({"L1"}), 0.5, True),  # not seen lately
        bb.Peer("e", frozenset({"Z"}), 0.001, True),  # shares nothing
        bb.Peer("f", frozenset({"L0"}), 0.0, True),  # already queued
    ]
    assert bb.expected(head, peers, frozenset({"a", "f"}), lim) == {"b"}
    assert bb.linger_s(frozenset({"b"}), 0.0, lim) == pytest.approx(0.002)
    assert bb.linger_s(frozenset({"b"}), 0.003, lim) == 0.0
    assert bb.linger_s(frozenset(), 0.0, lim) == 0.0


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="rows_per_pass"):
        bb.BatchLimits(rows_per_pass=0)
    with pytest.raises(ValueError, match="final"):
        bb.BatchLimits(per_label=(("final", 0),))
    with pytest.raises(ValueError, match="recent_s"):
        bb.BatchLimits(recent_s=-1)
    with pytest.raises(ValueError, match="at least one"):
        bb.plan([], bb.BatchLimits())


@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # chain
            st.integers(1, 12),  # rows
            st.lists(st.integers(0, 2), min_size=3, max_size=3),  # instance per layer
            st.integers(0, 3),  # waited
        ),
        min_size=1,
        max_size=8,
    ),
    st.integers(1, 20),
)
def test_plan_invariants(raw: list[tuple[int, int, list[int], int]], limit: int) -> None:
    pending = [
        _step(k, f"c{c}", rows, [f"{i}:{p}" for i, p in enumerate(ps)], waited)
        for k, (c, rows, ps, waited) in enumerate(raw)
    ]
    plan = bb.plan(pending, bb.BatchLimits(rows_per_pass=limit))
    head = bb.priority(pending)[0]
    assert plan.steps[0] == head.key  # the most passed-over (then oldest) always runs
    assert sorted(plan.steps + plan.waiting) == [s.key for s in pending]
    chains = [pending[k].chain for k in plan.steps]
    assert len(chains) == len(set(chains))
    for p in plan.passes:
        assert p.rows <= limit or p.steps == (head.key,)
        assert p.rows == sum(pending[k].rows for k in p.steps)
    # every admitted step's layers are covered by exactly one pass each
    for k in plan.steps:
        covered = [p for p in plan.passes if k in p.steps]
        assert len(covered) == len(pending[k].uses)
