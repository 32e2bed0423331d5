"""The gateway's KV-owner-first rule (`policies.kv_dispatch`), pure: owner with room, owner
full, owner absent, recompute cost, per-variant prefix keys, class shares."""

from __future__ import annotations

import pytest

from tessera.policies.routing import kv_dispatch as kd


def cand(id: str, **kw: float) -> kd.Candidate:
    base: dict[str, float] = {
        "running": 0,
        "batch_limit": 4,
        "queued_tokens": 0,
        "tokens_per_s": 1000.0,
    }
    base.update(kw)
    return kd.Candidate(id, **base)  # type: ignore[arg-type]


def req(owner: str | None = None, cached: int = 0, share_draw: float = 0.0) -> kd.KvRequest:
    return kd.KvRequest(400, 20, owner, cached, share_draw)


def test_owner_with_room_wins_even_when_busier() -> None:
    cs = [cand("a", running=3, queued_tokens=2000), cand("b")]
    d = kd.decide(cs, req("a", 384))
    assert d is not None and (d.replica_id, d.reason) == ("a", "kv_owner")


def test_full_owner_goes_to_lowest_latency_counting_the_recompute() -> None:
    full = cand("a", running=4, batch_limit=4, queued_tokens=600)  # 4 x 150 tokens left
    busy = cand("b", queued_tokens=300)
    idle = cand("c")
    d = kd.decide([full, busy, idle], req("a", 384))
    assert d is not None and (d.replica_id, d.reason) == ("c", "owner_full")
    # c pays the whole prompt (16 uncached + 384 recomputed) + 20 generated tokens
    assert d.estimated_s == pytest.approx((16 + 20 + 384) / 1000)
    # a full owner still wins when the others are far worse: its queue is cheaper than
    # recomputing 384 tokens on a slow replica
    slow = cand("s", tokens_per_s=100.0)
    d = kd.decide([cand("a", running=4, batch_limit=4, queued_tokens=600), slow], req("a", 384))
    assert d is not None and (d.replica_id, d.reason) == ("a", "owner_full")


def test_no_owner_lowest_latency_and_ties_share_traffic() -> None:
    d = kd.decide([cand("a", queued_tokens=500), cand("b", queued_tokens=50)], req())
    assert d is not None and (d.replica_id, d.reason) == ("b", "lowest_latency")
    # within TIE of each other: fewer in flight, then least recently picked
    a, b = cand("a", tokens_per_s=1100.0, last_pick=5), cand("b", last_pick=2)
    d = kd.decide([a, b], req())
    assert d is not None and d.replica_id == "b"
    # a clearly faster replica wins regardless of recency
    d = kd.decide([cand("a", tokens_per_s=3000.0, last_pick=9), b], req())
    assert d is not None and d.replica_id == "a"
    assert kd.decide([], req()) is None


def test_an_owner_outside_the_candidates_is_no_owner() -> None:
    d = kd.decide([cand("b"), cand("c", queued_tokens=10)], req("a", 384))
    assert d is not None and (d.replica_id, d.reason) == ("b", "lowest_latency")


def test_class_shares_start_conversations_kv_continues_them() -> None:
    cs = [cand("a", share=0.75), cand("b", share=0.25), cand("c")]
    picks = [kd.decide(cs, req(share_draw=u / 100)) for u in range(100)]
    assert {p.reason for p in picks if p} == {"class_share"}
    assert sum(p.replica_id == "a" for p in picks if p) == 75
    assert not any(p.replica_id == "c" for p in picks if p)  # outside the plan's set
    d = kd.decide(cs, req("b", 384, share_draw=0.1))
    assert d is not None and (d.replica_id, d.reason) == ("b", "kv_owner")
    # the owner c is outside the class's set: no owner there, the shares choose
    d = kd.decide(cs, req("c", 384, share_draw=0.9))
    assert d is not None and (d.replica_id, d.reason) == ("b", "class_share")
    with pytest.raises(ValueError, match="share_draw"):
        kd.decide(cs, req(share_draw=1.0))


def test_prefix_keys_are_page_aligned_chained_and_per_namespace() -> None:
    prompt = list(range(100, 150))  # 50 tokens: 3 full pages of 16 before the last token
    keys = kd.reusable_keys("", prompt, 16)
    assert len(keys) == 3 and len(kd.reusable_keys("", prompt[:49], 16)) == 3
    assert len(kd.reusable_keys("", prompt[:48], 16)) == 2  # the 48th token is computed
    longer = kd.prefix_keys("", [*prompt, 7, 8, 9], 16)
    assert longer[:3] == keys  # a continuation shares its prefix's keys
    assert kd.prefix_keys("legal", prompt, 16)[0] != kd.prefix_keys("", prompt, 16)[0]
    other = kd.prefix_keys("", [0, *prompt[1:]], 16)
    assert not set(other) & set(keys)  # a different first token changes every key
    with pytest.raises(ValueError, match="page_size"):
        kd.prefix_keys("", prompt, 0)


def test_prefix_owners_longest_prefix_per_namespace_bounded() -> None:
    owners = kd.PrefixOwners(entries=8)
    base = list(range(64))
    owners.remember(kd.prefix_keys("", base[:32], 16), "a")
    owners.remember(kd.prefix_keys("", base, 16), "b")  # b computed the longer prefix
    turn2 = kd.reusable_keys("", [*base, 1, 2, 3], 16)
    assert owners.lookup(turn2, {"a", "b"}) == ("b", 4)
    # b also took over pages 0-1 (it computed them last): a holds nothing remembered now
    assert owners.lookup(turn2, {"a"}) == (None, 0)
    assert owners.lookup(kd.reusable_keys("legal", [*base, 1], 16), {"a", "b"}) == (None, 0)
    owners.forget({"a"})
    assert owners.lookup(turn2, {"a", "b"}) == (None, 0) and len(owners) == 0
    owners.remember(kd.prefix_keys("", list(range(16 * 20)), 16), "a")
    assert len(owners) == 8  # bounded: the oldest keys went first
    with pytest.raises(ValueError, match="entries"):
        kd.PrefixOwners(0)
