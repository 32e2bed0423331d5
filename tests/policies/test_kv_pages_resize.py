"""The page allocator shrinks and grows at run time (issue 34): a shrink moves live pages
below the limit (block tables and the prefix cache follow), releases the top of the pool,
and never goes below the pages sequences hold."""

from __future__ import annotations

import random

import pytest

from tessera.kvpages import PageAllocator


def test_shrink_moves_live_pages_and_keeps_tables_consistent() -> None:
    a = PageAllocator(16, 4)
    for i in range(4):
        assert a.grow(f"s{i}", 12)  # 3 pages each: pages 0-11
    a.free("s0")
    a.free("s2")  # held now: 3-5 and 9-11
    before = {s: list(a.block_table(s)) for s in ("s1", "s3")}
    moves = a.resize(6)
    assert a.num_pages == 6 and a.held_pages == 6
    assert set(moves) == {p for t in before.values() for p in t if p >= 6}
    assert all(new < 6 for new in moves.values())
    for s, table in before.items():
        assert a.block_table(s) == [moves.get(p, p) for p in table]
    assert a.free_pages == 0 and not a.can_grow("s1", 13)


def test_never_below_what_sequences_hold() -> None:
    a = PageAllocator(8, 4)
    assert a.grow("s", 20)  # 5 pages
    with pytest.raises(ValueError, match="5 are held"):
        a.resize(4)
    assert a.num_pages == 8 and a.held_pages == 5
    with pytest.raises(ValueError):
        a.resize(0)


def test_grow_after_shrink_adds_fresh_pages_at_the_top() -> None:
    a = PageAllocator(8, 4)
    assert a.grow("s", 8)
    a.resize(3)
    assert a.resize(10) == {}
    assert a.num_pages == 10 and a.free_pages == 8
    assert a.grow("t", 32)
    assert sorted(a.block_table("t") + a.block_table("s")) == list(range(10))


def test_cached_pages_above_the_limit_are_evicted_and_held_ones_keep_their_key() -> None:
    a = PageAllocator(8, 2)
    toks = list(range(8))
    assert a.grow("x", 8)
    a.register("x", toks, 8)  # pages 0-3 registered
    assert a.grow("y", 8)  # pages 4-7, not registered
    a.free("x")  # 0-3: cached, unheld
    a.register("y", [9] * 8, 8)  # y's pages registered too
    moves = a.resize(4)
    assert set(moves) == {4, 5, 6, 7} and a.cached_pages == 4  # x's cache evicted
    assert a.share_prefix("z", [9] * 8 + [1]) == 8  # y's prefix still found, at new ids
    assert a.block_table("z") == a.block_table("y")


def test_random_shrinks_keep_every_invariant() -> None:
    rng = random.Random(7)
    a = PageAllocator(64, 4)
    live: dict[str, int] = {}
    for step in range(400):
        op = rng.random()
        if op < 0.5:
            s = f"s{step}"
            n = rng.randint(1, 24)
            if a.grow(s, n):
                live[s] = n
        elif op < 0.8 and live:
            s = rng.choice(sorted(live))
            a.free(s)
            del live[s]
        else:
            want = rng.randint(1, 96)
            if want < a.held_pages:
                with pytest.raises(ValueError):
                    a.resize(want)
            else:
                a.resize(want)
        tables = [p for s in live for p in a.block_table(s)]
        assert len(tables) == len(set(tables)) == a.held_pages
        assert all(0 <= p < a.num_pages for p in tables)
        assert a.free_pages + a.held_pages == a.num_pages
