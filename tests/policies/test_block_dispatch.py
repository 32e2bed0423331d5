"""KV-owner-first dispatch between instances of a block (BlockLLM §5)."""

from __future__ import annotations

import pytest

from tessera.policies.routing import block_dispatch as bd


def inst(id: str, **kw: float) -> bd.BlockInstance:
    base = {"running": 0, "batch_limit": 4, "queued_tokens": 0, "tokens_per_s": 1000.0}
    base.update(kw)
    return bd.BlockInstance(id, **base)  # type: ignore[arg-type]


def test_owner_first_while_it_has_room() -> None:
    busy_owner = inst("a", queued_tokens=500, running=3)
    idle = inst("b")
    d = bd.choose([busy_owner, idle], tokens=10, kv_bytes=1 << 20, owner="a")
    assert (d.instance, d.reason, d.moves_kv) == ("a", "kv-owner", False)


def test_full_owner_falls_back_to_lowest_latency_with_transfer_cost() -> None:
    full_owner = inst("a", running=4, queued_tokens=300)
    near = inst("b", queued_tokens=100, link_bytes_per_s=1e9)
    far = inst("c", link_bytes_per_s=1e6)  # idle, but moving 1 MiB takes ~1 s
    d = bd.choose([full_owner, near, far], tokens=10, kv_bytes=1 << 20, owner="a")
    assert (d.instance, d.reason, d.moves_kv) == ("b", "lowest-latency", True)
    assert d.estimated_s == pytest.approx(100 / 1000 + 10 / 1000 + (1 << 20) / 1e9)


def test_new_request_goes_to_least_loaded() -> None:
    d = bd.choose([inst("a", queued_tokens=50), inst("b", queued_tokens=5)], 8, 0, None)
    assert (d.instance, d.moves_kv) == ("b", False)


def test_owner_not_serving_counts_as_no_owner_for_transfer() -> None:
    d = bd.choose([inst("a"), inst("b", tokens_per_s=2000.0)], 8, 1 << 30, owner="gone")
    assert d.instance == "b"  # both pay the same transfer; b computes faster


def test_errors() -> None:
    with pytest.raises(ValueError, match="no instance"):
        bd.choose([], 1, 0, None)
    with pytest.raises(ValueError, match="batch_limit"):
        inst("x", batch_limit=0)


def test_an_instance_that_cannot_receive_kv_pays_recomputing_it() -> None:
    owner = inst("a", running=4)  # full
    # b computes 2x faster but must recompute 900 cached tokens; c is slower but close
    b = bd.BlockInstance("b", 0, 4, 0, 2000.0, receives_kv=False)
    c = bd.BlockInstance("c", 0, 4, 0, 1000.0, link_bytes_per_s=1e12)
    d = bd.choose([owner, b, c], tokens=100, kv_bytes=1 << 20, owner="a", kv_tokens=900)
    assert d.instance == "c"  # 0.1 s + 1 us transfer beats b's 0.05 + 0.45 s recompute
    assert bd.estimate_s(b, 100, 1 << 20, "a", 900) == pytest.approx(1000 / 2000)
    # where b holds the KV itself, nothing is recomputed
    assert bd.estimate_s(b, 100, 1 << 20, "b", 900) == pytest.approx(100 / 2000)


def test_tolerance_lets_rank_break_near_ties() -> None:
    fast, slow = inst("a", tokens_per_s=1100.0), inst("b")
    assert bd.choose([fast, slow], 10, 0, None).instance == "a"
    ranked = bd.choose([fast, slow], 10, 0, None, tolerance=0.25, rank={"a": (1,), "b": (0,)})
    assert ranked.instance == "b"
    far = inst("c", tokens_per_s=500.0)  # twice as slow: outside the tolerance
    assert bd.choose([fast, far], 10, 0, None, tolerance=0.25, rank={"c": (-1,)}).instance == "a"
    with pytest.raises(ValueError, match="tolerance"):
        bd.choose([fast], 10, 0, None, tolerance=-1)
