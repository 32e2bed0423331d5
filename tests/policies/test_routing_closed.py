"""A closed replica (an overload drop's head) gets new requests only when no other is ready."""

from __future__ import annotations

from tessera.policies.routing import closed


def test_closed_replicas_give_way_to_open_ones() -> None:
    assert closed.open_first(["r0", "r1", "r2"], {"r0"}) == ["r1", "r2"]


def test_when_every_ready_replica_is_closed_all_stay_candidates() -> None:
    """A request waits on a dropping head rather than for nothing (as before closing)."""
    assert closed.open_first(["r0", "r2"], {"r0", "r2"}) == ["r0", "r2"]
    assert closed.open_first([], {"r0"}) == []
    assert closed.open_first(["r1", "r0"], set()) == ["r1", "r0"]
