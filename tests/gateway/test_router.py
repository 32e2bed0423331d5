"""Routing without servers: least outstanding tokens, tie rotation, accounting, class shares."""

from __future__ import annotations

import collections

import pytest

from tessera.gateway import router
from tessera.policies.routing import shares as routing


def test_least_outstanding_tokens_wins() -> None:
    r = router.Router()
    a = r.admit("a", prompt_tokens=100, max_tokens=50)
    r.admit("b", prompt_tokens=10, max_tokens=20)
    assert (r.outstanding("a"), r.outstanding("b")) == (150, 30)
    assert r.choose(["a", "b"], 5, 5) == router.Route("b", "least_outstanding")
    r.progress(a, 1)  # first token: the prompt is prefilled, 49 tokens remain
    assert r.outstanding("a") == 49
    r.progress(a, 30)
    assert r.outstanding("a") == 19
    assert r.choose(["a", "b"], 5, 5).replica_id == "a"
    r.release(a)
    r.release(a)  # idempotent
    assert (r.outstanding("a"), r.in_flight("a")) == (0, 0)
    assert r.choose([], 1, 1) is None


def test_ties_rotate_so_idle_replicas_share_sequential_traffic() -> None:
    r = router.Router()
    picks = [r.choose(["a", "b", "c"], 10, 10).replica_id for _ in range(6)]
    assert picks == ["a", "b", "c", "a", "b", "c"]
    r.admit("a", 0, 5)
    r.admit("b", 0, 5)
    r.admit("b", 0, 0)  # same tokens as a, but more requests in flight
    assert r.choose(["a", "b"], 1, 1).replica_id == "a"


def test_class_shares_pick_by_weight_and_fall_back() -> None:
    classify = router.centroid_class_router({"short": (32, 32), "long": (2000, 500)})
    assert classify(20, 16) == "short" and classify(1500, 700) == "long"
    r = router.Router(seed=3)
    r.set_class_shares({"short": {"a": 0.75, "b": 0.25}, "long": {"c": 1.0}}, classify)
    counts = collections.Counter(r.choose(["a", "b", "c"], 20, 16).replica_id for _ in range(2000))
    assert set(counts) == {"a", "b"} and 0.70 < counts["a"] / 2000 < 0.80
    route = r.choose(["a", "b", "c"], 1500, 700)
    assert route == router.Route("c", "class_share", "long")
    # the class's replicas are not ready: least outstanding tokens among the ready ones
    r.admit("a", 100, 100)
    assert r.choose(["a", "b"], 1500, 700) == router.Route("b", "least_outstanding", "long")
    # deterministic for a seed
    r1, r2 = router.Router(seed=9), router.Router(seed=9)
    for x in (r1, r2):
        x.set_class_shares({"short": {"a": 0.5, "b": 0.5}}, classify)
    seq = [[x.choose(["a", "b"], 10, 10).replica_id for _ in range(20)] for x in (r1, r2)]
    assert seq[0] == seq[1]
    # empty shares: plain balancing again
    r1.set_class_shares({}, classify)
    assert r1.choose(["a", "b"], 10, 10).policy == "least_outstanding"
    with pytest.raises(ValueError, match="not >= 0"):
        r1.set_class_shares({"short": {"a": -1.0}}, classify)


def test_workload_class_router_maps_ids_to_names() -> None:
    class Fake:
        def classify(self, input_tokens: int, output_tokens: int) -> int:
            return 0 if input_tokens < 100 else 1

    classify = router.workload_class_router(Fake(), ["c0", "c1"])
    assert (classify(10, 10), classify(500, 10)) == ("c0", "c1")


def test_prefix_affinity_prefers_the_kv_owner_while_it_is_worth_it() -> None:
    r = router.Router()
    system = list(range(1000, 1100))  # a 100-token shared prompt prefix
    first = r.choose(["a", "b"], 110, 8, [*system, *range(10)])
    assert first == router.Route("a", "least_outstanding")
    busy = r.admit("a", 0, 60)  # a is busier than b by 60 tokens < 64 saved
    route = r.choose(["a", "b"], 105, 8, [*system, 7, 7, 7, 7, 7])
    assert route == router.Route("a", "prefix_affinity")  # 64-token prefix known on a
    r.admit("a", 0, 10)  # now 70 more than b: the saved prefill no longer pays
    route = r.choose(["a", "b"], 105, 8, [*system, 1, 2, 3, 4, 5])
    assert route == router.Route("b", "least_outstanding")
    r.release(busy)  # a: 10 outstanding, b: 0
    # b got the prefix last and owns it now; a request b would not get by load alone goes there
    r.admit("b", 0, 30)
    assert r.choose(["a", "b"], 105, 8, [*system, 9]) == router.Route("b", "prefix_affinity")
    assert r.choose(["a", "b"], 40, 8, list(range(40))).policy == "least_outstanding"
    # the owner is not ready: balance among the ready ones
    assert r.choose(["a"], 105, 8, [*system, 9]) == router.Route("a", "least_outstanding")
    # short prompts (under 33 tokens) are never remembered
    assert r.choose(["a", "b"], 32, 8, list(range(32))).policy == "least_outstanding"
    assert r.choose(["a", "b"], 32, 8, list(range(32))).policy == "least_outstanding"


def test_remembered_prefixes_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routing, "PREFIX_ENTRIES", 3)
    r = router.Router()
    for i in range(5):
        r.choose(["a"], 40, 1, [i] * 40)
    assert len(r._owners) == 3


def test_prefix_affinity_is_per_variant() -> None:
    """The router's prefix hint (used when KV-owner-first dispatch is off) never sends a
    request to a replica for a prefix cached under another variant's adapter."""
    r = router.Router()
    system = list(range(1000, 1100))
    assert r.choose(["a", "b"], 105, 8, [*system, 1], "legal").replica_id == "a"
    r.admit("a", 0, 20)  # a is busier; b would win on load alone
    same = r.choose(["a", "b"], 105, 8, [*system, 2], "legal")
    assert same == router.Route("a", "prefix_affinity")
    other = r.choose(["a", "b"], 105, 8, [*system, 3], "med")
    assert other == router.Route("b", "least_outstanding")
