"""`gc_heap`: the entry points' switch; settling freezes survivors; reclaim collects frozen
cycles."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from tessera import gc_heap


@pytest.fixture
def restore() -> Iterator[None]:
    yield
    gc.unfreeze()


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cycle collector frees it


def test_off_by_env() -> None:
    assert not gc_heap.wanted({gc_heap.ENV: "0"}) and gc_heap.wanted({})


def test_settle_freezes_and_reclaim_collects_a_dropped_cycle(
    monkeypatch: pytest.MonkeyPatch, restore: None
) -> None:
    node = Node()
    ref = weakref.ref(node)
    took = gc_heap.settle("loaded")
    assert took is not None and took >= 0
    assert gc.get_freeze_count() > 0
    del node  # now garbage, but frozen: a plain pass does not see it
    gc.collect()
    assert ref() is not None
    gc_heap.settle("unloaded", reclaim=True)
    assert ref() is None
