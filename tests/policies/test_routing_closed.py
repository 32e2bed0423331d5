"""A closed replica (an overload drop's head) gives way to open replicas with room."""

from __future__ import annotations

from tessera.policies.routing import closed


def test_a_full_closed_replica_gives_way_to_ones_with_room() -> None:
    assert closed.open_first(["r0", "r1", "r2"], {"r0"}, {"r1", "r2"}) == ["r1", "r2"]
    assert closed.open_first(["r0", "r1", "r2"], {"r0"}, {"r2"}) == ["r2"]


def test_full_open_replicas_do_not_beat_the_closed_head() -> None:
    """A whole replica with a full pool or a queue is no better than a head about to
    grow: every ready replica stays a candidate (a reopen reaches the gateway late)."""
    assert closed.open_first(["r0", "r1", "r2"], {"r0"}, set()) == ["r0", "r1", "r2"]
    assert closed.open_first(["r0", "r2"], {"r0", "r2"}, set()) == ["r0", "r2"]


def test_a_closed_replica_with_room_counts_as_open() -> None:
    """The head resumed with its grown pool: the gateway's poll sees room, and the head
    takes requests before the routes' reopen (which crosses the operator) arrives."""
    assert closed.open_first(["r0", "r1"], {"r0"}, {"r0", "r1"}) == ["r0", "r1"]
    assert closed.open_first(["r0", "r1", "r2"], {"r0"}, {"r0", "r2"}) == ["r0", "r1", "r2"]


def test_nothing_changes_while_no_ready_replica_is_closed() -> None:
    assert closed.open_first(["r1", "r0"], set(), {"r0"}) == ["r1", "r0"]
    assert closed.open_first(["r1"], {"r9"}, set()) == ["r1"]
    assert closed.open_first([], {"r0"}, set()) == []
