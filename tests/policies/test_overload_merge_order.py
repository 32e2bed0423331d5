"""Which whole replicas a drop pairs, and which of each pair is the head (pure; issue 30)."""

from __future__ import annotations

from tessera.policies.overload import drop_plan

C = drop_plan.Candidate


def _groups(order: tuple[str, ...], merges_needed: int) -> list[tuple[str, ...]]:
    """The groups `plan_drop` makes from `order` (one layer byte each, R = merges' bytes)."""
    plan = drop_plan.plan_drop(
        drop_plan.DropInput(
            tuple(drop_plan.Replica(n, frozenset(range(8))) for n in order),
            (1,) * 8,
            8 * merges_needed,
        )
    )
    return [tuple(s.replica for s in g.stages) for g in plan.groups if g.changed]


def test_the_busiest_firing_replica_heads_and_the_idlest_donates() -> None:
    """The head keeps its running requests through the drop; the donor must finish its
    started ones first: a drop waits for the donor, so the donor is the least busy."""
    order = drop_plan.merge_order(
        [C("r0", False, 6), C("r1", True, 3), C("r2", False, 0), C("r3", True, 5)]
    )
    assert order == ("r3", "r2", "r1", "r0")
    # plan_drop: stage 0 (the head) is the first of each pair
    assert _groups(order, 1) == [("r3", "r2")]
    assert _groups(order, 2) == [("r3", "r2"), ("r1", "r0")]


def test_by_name_the_old_order_picked_a_busy_donor() -> None:
    """The rule this replaces (firing first, then by name) merged the two firing replicas:
    r1's queue waited for r3 to finish its 5 started requests. Now each firing replica
    heads a group, and the first merge takes the idlest donor."""
    cands = [C("r0", False, 6), C("r1", True, 3), C("r2", False, 0), C("r3", True, 5)]
    by_name = tuple(sorted((c.name for c in cands), key=lambda n: (n not in {"r1", "r3"}, n)))
    assert _groups(by_name, 1) == [("r1", "r3")]
    assert _groups(drop_plan.merge_order(cands), 1) == [("r3", "r2")]
    heads = {g[0] for g in _groups(drop_plan.merge_order(cands), 2)}
    assert heads == {"r1", "r3"}


def test_odd_counts_and_ties() -> None:
    assert drop_plan.merge_order([]) == ()
    assert drop_plan.merge_order([C("a", True, 1)]) == ("a",)
    same = [C(n, True, 2) for n in ("c", "a", "b")]
    assert drop_plan.merge_order(same) == ("a", "c", "b")
