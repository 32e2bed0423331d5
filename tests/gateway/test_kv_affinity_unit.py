"""`gateway.kv_affinity` without servers: what it feeds the KV-owner-first rule (owners per
variant from what it dispatched, load from the router's accounting, the batch limit and
page size from polls, throughput from chunk gaps, class shares) and what it decides."""

from __future__ import annotations

import pytest

from tessera.gateway import config, kv_affinity, metrics, replicas, router
from tessera.policies.routing import kv_dispatch


async def _setup(limit: int = 2) -> tuple[kv_affinity.KvAffinity, router.Router]:
    gauges = metrics.GatewayMetrics()
    rs = replicas.ReplicaSet(gauges, tls=None)
    rs.update([config.ReplicaEndpoint(r, "127.0.0.1:1") for r in ("a", "b")])
    for st in rs.states().values():  # as a poll would leave them
        st.ready, st.max_num_seqs, st.page_size = True, limit, 16
    route = router.Router()
    return kv_affinity.KvAffinity(rs, route, gauges), route


def _pick(aff: kv_affinity.KvAffinity, prompt: list[int], ns: str = "") -> tuple[str, str]:
    r = aff.choose(["a", "b"], prompt, 8, ns)
    assert r is not None
    return r.replica_id, r.policy


async def test_turns_follow_the_owner_per_variant_until_its_batch_is_full() -> None:
    aff, route = await _setup(limit=2)
    turn1 = list(range(100, 150))
    assert _pick(aff, turn1) == ("a", "lowest_latency")  # a tie: the first id
    aff.finished("a", [*turn1, *range(8)], "")
    turn2 = [*turn1, *range(8), 1, 2, 3]
    assert _pick(aff, turn2) == ("a", "kv_owner")
    assert _pick(aff, turn2, "legal") == ("b", "lowest_latency")  # not drawn across variants
    tickets = [route.admit("a", 60, 200) for _ in range(2)]  # a's batch (limit 2) is full
    assert _pick(aff, turn2) == ("b", "owner_full")
    for t in tickets:
        route.release(t)
    assert _pick(aff, [*turn2, 4]) == ("b", "kv_owner")  # b computed turn 2 last
    assert aff.choose([], turn2, 8, "") is None


async def test_class_shares_choose_new_conversations() -> None:
    aff, route = await _setup()
    route.set_class_shares({"all": {"b": 1.0}}, lambda p, m: "all")
    assert _pick(aff, list(range(40))) == ("b", "class_share")
    assert route.class_weights(40, 8) == {"b": 1.0}


def test_throughput_follows_chunk_gaps() -> None:
    t = kv_affinity.Throughput()
    assert t.rate is None
    t.observe(1, 10.0, first=True)  # a prefill: only marks the time
    assert t.rate is None
    for i in range(1, 11):
        t.observe(2, 10.0 + 0.1 * i, first=False)  # 2 tokens every 0.1 s
    assert t.rate == pytest.approx(20.0)
    t.observe(2, 30.0, first=False)  # after an idle gap: not a sample
    assert t.rate == pytest.approx(20.0)


async def test_owners_of_a_replica_that_left_or_moved_are_forgotten() -> None:
    aff, _ = await _setup()
    rs = aff._replicas
    turn = list(range(100, 150))
    keys = kv_dispatch.reusable_keys("", turn, 16)
    aff.finished("a", [*turn, 7], "")
    aff.choose(["a", "b"], [1, 2, 3], 8, "")  # membership unchanged: nothing forgotten
    assert aff.owners.lookup(keys, ["a", "b"]) == ("a", len(keys))
    # "a" moves to another leader (a relayout): same id, a new endpoint without its KV
    rs.update([config.ReplicaEndpoint(r, f"127.0.0.1:{p}") for r, p in (("a", 2), ("b", 1))])
    aff.choose(["b"], [1, 2, 3], 8, "")
    assert aff.owners.lookup(keys, ["a", "b"]) == (None, 0)
    aff.finished("b", [*turn, 7], "")
    assert aff.owners.lookup(keys, ["a", "b"]) == ("b", len(keys))
    rs.update([config.ReplicaEndpoint("a", "127.0.0.1:2")])  # "b" leaves the routes
    aff.choose(["a"], [1, 2, 3], 8, "")
    assert aff.owners.lookup(keys, ["a", "b"]) == (None, 0)


def test_throughput_is_per_stream() -> None:
    """Eight streams each stepping every 0.1 s and two streams at the same step time
    measure the same rate: one token per stream per step."""
    big, small = kv_affinity.Throughput(), kv_affinity.Throughput()
    for step in range(1, 11):
        for s in range(8):
            big.observe(1, 10.0 + 0.1 * step + 0.0125 * s, first=False, streams=8)
        for s in range(2):
            small.observe(1, 10.0 + 0.1 * step + 0.05 * s, first=False, streams=2)
    assert big.rate == pytest.approx(10.0, rel=0.05)
    assert small.rate == pytest.approx(10.0, rel=0.05)


async def test_a_bigger_batch_does_not_keep_winning_new_requests() -> None:
    """The burst skew (docs/overload.md): "a" runs 8 requests, "b" 2, both at one token
    per stream every 0.1 s. Measured over all streams together "a" looked 4x faster, so
    its estimated latency did not grow with its queue and it won the next request."""
    aff, route = await _setup(limit=64)
    tickets = [route.admit("a", 40, 50) for _ in range(8)]
    tickets += [route.admit("b", 40, 50) for _ in range(2)]
    for t in tickets:
        route.progress(t, 1)  # prefilled, 49 tokens to go each
    for step in range(1, 11):
        for s in range(8):
            aff.observe("a", 1, 10.0 + 0.1 * step + 0.0125 * s, first=False)
        for s in range(2):
            aff.observe("b", 1, 10.0 + 0.1 * step + 0.05 * s, first=False)
    picks = []
    for i in range(6):  # six new conversations (no owner), each admitted where it went
        rid, reason = _pick(aff, list(range(1000 * i, 1000 * i + 40)))
        assert reason == "lowest_latency"
        picks.append(rid)
        route.admit(rid, 40, 8)
    assert picks == ["b"] * 6  # its outstanding work stays below "a"'s (386 < 392 tokens)
