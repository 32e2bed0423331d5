"""Coordinated KV exchange and restore transfers (KunServe §4.2, §4.4)."""

from __future__ import annotations

import pytest

from tessera.policies.overload import drop_plan as dp
from tessera.policies.overload import kv_exchange as kx

L, LAYER = 8, 100
ALL = frozenset(range(L))


def _group() -> dp.Group:
    reps = (dp.Replica("a", ALL), dp.Replica("b", ALL))
    plan = dp.plan_drop(dp.DropInput(reps, (LAYER,) * L, 1))
    (g,) = plan.groups
    return g


def test_drop_moves_each_request_kv_to_the_other_stage() -> None:
    g = _group()
    assert [(s.replica, s.start, s.end) for s in g.stages] == [("a", 0, 4), ("b", 4, 8)]
    running = [kx.RunningRequest("r1", "a", 30), kx.RunningRequest("r2", "b", 10)]
    moves = kx.exchange_for_drop(g, {"a": ALL, "b": ALL}, running, 8, chunk=256)
    # the shorter request goes first; each sends the layers the other member keeps
    assert [(t.request, t.source, t.target, t.start, t.end) for t in moves] == [
        ("r2", "b", "a", 0, 4),
        ("r1", "a", "b", 4, 8),
    ]
    assert moves[1].bytes == 30 * 8 * 4 == sum(moves[1].chunks)
    assert moves[1].chunks == (256, 256, 256, 192)


def test_chunk_is_about_one_stage_step_in_whole_pages() -> None:
    assert kx.chunk_bytes(1e9, 0.002, 4096) == (2_000_000 // 4096) * 4096
    assert kx.chunk_bytes(1e3, 0.001, 4096) == 4096  # never below one page
    with pytest.raises(ValueError):
        kx.chunk_bytes(0.0, 1.0, 1)


def test_restore_pulls_dropped_layers_and_gathers_kv_at_balanced_homes() -> None:
    g = _group()
    running = [kx.RunningRequest(f"r{i}", "", n) for i, n in enumerate((50, 40, 30, 20))]
    homes = kx.restore_homes(g, running)
    load = {m: sum(r.tokens for r in running if homes[r.request] == m) for m in g.members}
    assert load == {"a": 70, "b": 70}
    moves = kx.plan_restore(g, {"a": ALL, "b": ALL}, (LAYER,) * L, running, 8, chunk=10_000)
    params = [t for t in moves if t.kind == "params"]
    assert [(t.source, t.target, t.start, t.end, t.bytes) for t in params] == [
        ("b", "a", 4, 8, 4 * LAYER),
        ("a", "b", 0, 4, 4 * LAYER),
    ]
    for t in moves:
        if t.kind == "kv":
            assert t.target == homes[t.request] and t.source != t.target
    assert len([t for t in moves if t.kind == "kv"]) == 4  # half the layers each


def test_arbiter_sends_activations_before_kv_before_parameters() -> None:
    pending = [
        kx.Pending("params", 0, 10),
        kx.Pending("kv", 1, 10),
        kx.Pending("activation", 5, 1),
        kx.Pending("kv", 2, 10),
    ]
    order = []
    while pending:
        nxt = kx.next_transfer(pending)
        assert nxt is not None
        order.append((nxt.kind, nxt.seq))
        pending.remove(nxt)
    assert order == [("activation", 5), ("kv", 1), ("kv", 2), ("params", 0)]
    assert kx.next_transfer([]) is None
