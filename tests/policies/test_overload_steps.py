"""The ordered steps of a live KunServe drop and restore (policies/overload/steps.py)."""

from __future__ import annotations

import pytest

from tessera.policies.overload import drop_plan
from tessera.policies.overload import steps as overload_steps
from tessera.policies.overload.steps import (
    BlockRef,
    Compact,
    Drain,
    ExchangeKV,
    Member,
    MovePages,
    Pause,
    Resume,
    Routes,
    Shift,
)

MEMBERS = {n: Member(n, f"10.0.0.{i}:1") for i, n in enumerate(("a", "b", "c"))}


def _group(*stages: tuple[str, int, int]) -> drop_plan.Group:
    st = tuple(drop_plan.Stage(r, s, e) for r, s, e in stages)
    return drop_plan.Group(tuple(s.replica for s in st), st, 1, True)


def test_two_member_drop_orders_routes_drain_pause_shifts_exchange_resume() -> None:
    steps = overload_steps.drop_steps(_group(("a", 0, 4), ("b", 4, 8)), MEMBERS)
    a0, b0 = BlockRef("10.0.0.0:1", "a", 0), BlockRef("10.0.0.1:1", "b", 0)
    a1 = BlockRef("10.0.0.1:1", "a", 1)  # b's block becomes stage 1 of a's replica
    assert steps == (
        Routes(remove=("b",), close=("a",)),  # arrivals go elsewhere while b drains
        Drain(b0),
        Pause(a0),
        Shift("drop", b0, 4, 8, a1, 2, ""),
        ExchangeKV(a0, a1, 4, 8),  # before the head drops the layers the K/V lives in
        Shift("drop", a0, 0, 4, a0, 2, "10.0.0.1:1"),
        Resume(a0, grow_to=(a0, a1)),
        Routes(reopen=("a",)),  # the grown pool takes new requests again
    )


def test_three_stages_chain_next_addresses_and_exchange_each_donor() -> None:
    steps = overload_steps.drop_steps(_group(("a", 0, 3), ("c", 6, 8), ("b", 3, 6)), MEMBERS)
    shifts = [s for s in steps if isinstance(s, Shift)]
    assert [(s.block.replica_id, s.start, s.end, s.becomes.stage_index) for s in shifts] == [
        ("b", 3, 6, 1),
        ("c", 6, 8, 2),
        ("a", 0, 3, 0),
    ]
    assert [s.next_address for s in shifts] == ["10.0.0.2:1", "", "10.0.0.1:1"]
    assert [(e.target.address, e.start, e.end) for e in steps if isinstance(e, ExchangeKV)] == [
        ("10.0.0.1:1", 3, 6),
        ("10.0.0.2:1", 6, 8),
    ]


def test_restore_is_the_inverse_with_requests_coming_home_to_the_head() -> None:
    steps = overload_steps.restore_steps(_group(("a", 0, 4), ("b", 4, 8)), MEMBERS, 8)
    a0, a1 = BlockRef("10.0.0.0:1", "a", 0), BlockRef("10.0.0.1:1", "a", 1)
    b0 = BlockRef("10.0.0.1:1", "b", 0)
    assert steps == (
        Pause(a0),
        Compact(a0),
        MovePages(a1),
        Shift("restore", a0, 0, 8, a0, 1, "", ((a1, 4, 8),)),
        ExchangeKV(a1, a0, 4, 8),
        Resume(a0),
        Shift("restore", a1, 0, 8, b0, 1, "", ((a0, 0, 8),)),
        Routes(add=("b",)),
    )


def test_single_member_groups_need_no_steps_and_bad_groups_are_refused() -> None:
    assert overload_steps.drop_steps(_group(("a", 0, 8)), MEMBERS) == ()
    assert overload_steps.restore_steps(_group(("a", 0, 8)), MEMBERS, 8) == ()
    with pytest.raises(ValueError, match="no stage starts at layer 0"):
        overload_steps.drop_steps(_group(("a", 1, 4), ("b", 4, 8)), MEMBERS)
    with pytest.raises(ValueError, match="one stage per member"):
        overload_steps.drop_steps(_group(("a", 0, 4), ("a", 4, 8)), MEMBERS)


def test_paper_case_plan_gives_two_pipelines_with_their_own_steps() -> None:
    p = 8
    plan = drop_plan.plan_drop(
        drop_plan.DropInput(
            tuple(drop_plan.Replica(n, frozenset(range(8))) for n in ("a", "b", "c", "d")),
            (p // 8,) * 8,
            required_bytes=3 * p // 2,
        )
    )
    members = {n: Member(n, f"h{n}:1") for n in "abcd"}
    heads = set()
    for g in plan.groups:
        steps = overload_steps.drop_steps(g, members)
        pause = next(s for s in steps if isinstance(s, Pause))
        heads.add(pause.block.replica_id)
        assert isinstance(steps[0], Routes) and pause.block.replica_id not in steps[0].remove
    assert len(heads) == 2
