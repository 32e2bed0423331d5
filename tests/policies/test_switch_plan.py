"""Greedy switch plan (OServe Algorithm 2) and its LP lower bound, without servers."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera import fields
from tessera.policies import device_links
from tessera.policies.device_links import DeviceLinks
from tessera.policies.placement import ModelBytes, ReplicaPlacement, StagePlacement
from tessera.policies.switching import switch_bound, switch_plan
from tessera.policies.transition import shards

GB = 1e9
LINKS = DeviceLinks(
    intra_node_bytes_per_s=100 * GB, inter_node_bytes_per_s=10 * GB, storage_bytes_per_s=1 * GB
)
MODEL = ModelBytes(num_layers=4, layer_bytes=1 * GB)  # 4 GB, no embedding / head


def rep(name: str, *stages: tuple[tuple[int, int], list[tuple[str, int]]]) -> ReplicaPlacement:
    return ReplicaPlacement(name, tuple(StagePlacement(lay, tuple(devs)) for lay, devs in stages))


def whole(name: str, node: str, idx: int) -> ReplicaPlacement:
    return rep(name, ((0, 4), [(node, idx)]))


def test_finest_common_split_covers_the_model_once_per_device() -> None:
    src = (rep("a", ((0, 4), [("n0", 0), ("n0", 1)])),)  # tp 2
    tgt = (rep("b", ((0, 1), [("n0", 0), ("n0", 1), ("n0", 2)]), ((1, 4), [("n1", 0)])),)
    model = ModelBytes(4, 1 * GB, embedding_bytes=0.5 * GB, lm_head_bytes=0.5 * GB)
    pieces = shards.split(model, src, tgt)
    assert math.isclose(sum(s.bytes for s in pieces), model.total_bytes)
    held = shards.holdings(pieces, tgt, 4)
    per_device = {d: sum(pieces[i].bytes for i in ids) for d, ids in held.items()}
    # stage 0 = embedding + layer 0 split three ways; stage 1 = layers 1-3 + head
    assert math.isclose(per_device[("n0", 0)], 1.5 * GB / 3)
    assert math.isclose(per_device[("n1", 0)], 3.5 * GB)
    # every target rank's slice is a union of whole shards: bytes add up exactly
    assert math.isclose(sum(per_device.values()), model.total_bytes)


def test_identical_layout_moves_nothing_even_when_relabelled() -> None:
    src = (whole("a", "n0", 0), whole("b", "n0", 1))
    tgt = (whole("x", "n7", 1), whole("y", "n7", 0))  # same shapes, other labels
    plan = switch_plan.plan(src, tgt, MODEL, LINKS)
    assert plan.transfers == ()
    assert plan.seconds == 0.0
    assert math.isclose(plan.bytes_in_place, 2 * MODEL.total_bytes)


def test_intra_node_source_preferred_over_idle_remote_one() -> None:
    # n0:0 holds the model and is the only local source; n1:0 (remote) holds it too.
    src = (whole("a", "n0", 0), whole("b", "n1", 0))
    tgt = (whole("a", "n0", 0), whole("b", "n1", 0), whole("c", "n0", 1))
    plan = switch_plan.plan(src, tgt, MODEL, LINKS, remap=False)
    assert {t.source for t in plan.transfers} == {("n0", 0)}
    assert {t.tier for t in plan.transfers} == {device_links.INTRA}
    assert math.isclose(plan.seconds, MODEL.total_bytes / LINKS.intra_node_bytes_per_s)


def test_least_loaded_link_chosen() -> None:
    # Two local sources hold everything; one target needs two shards (two stages' worth):
    # the second shard must come over the pair link that has carried nothing yet.
    src = (whole("a", "n0", 0), whole("b", "n0", 1))
    tgt = (
        whole("a", "n0", 0),
        whole("b", "n0", 1),
        rep("c", ((0, 2), [("n0", 2)]), ((2, 4), [("n0", 3)])),
        whole("d", "n0", 4),
    )
    plan = switch_plan.plan(src, tgt, MODEL, LINKS, remap=False)
    to_d = [t for t in plan.transfers if t.target == ("n0", 4)]
    # d's first shard: both pair links empty, n0:1 has sent less in total (tie-break);
    # d's second shard: the pair link n0:1->d now carries 2 GB, n0:0->d none: n0:0.
    assert [t.source for t in to_d] == [("n0", 1), ("n0", 0)]
    # The pair rule (the paper's) ignores that n0:0 also feeds c: it sends 6 GB, n0:1 2 GB,
    # while 4 GB each was possible. The LP bound sees it.
    sent = {s: sum(t.bytes for t in plan.transfers if t.source == s) for s in src_devs(src)}
    assert sent == {("n0", 0): 6 * GB, ("n0", 1): 2 * GB}
    lower = switch_bound.bound(src, plan, MODEL, LINKS)
    assert math.isclose(lower.seconds, 4 * GB / LINKS.intra_node_bytes_per_s, rel_tol=1e-6)
    # ranking by the senders' link time instead reaches the bound here
    sender = switch_plan.plan(src, tgt, MODEL, LINKS, remap=False, rule="sender")
    assert math.isclose(sender.seconds, lower.seconds, rel_tol=1e-6)


def src_devs(src: tuple[ReplicaPlacement, ...]) -> list[tuple[str, int]]:
    return [d for r in src for s in r.stages for d in s.devices]


def test_storage_only_for_shards_no_device_holds() -> None:
    # The source holds only layers [0, 2) (the rest was dropped); the target needs the
    # whole model: [0, 2) comes from the device, [2, 4) from storage, nothing else.
    src = (rep("a", ((0, 2), [("n0", 0)])),)
    tgt = (whole("b", "n0", 1),)
    plan = switch_plan.plan(src, tgt, MODEL, LINKS, remap=False)
    by_tier = dict(plan.bytes_by_tier)
    assert math.isclose(by_tier[device_links.INTRA], 2 * GB)
    assert math.isclose(by_tier[device_links.STORAGE], 2 * GB)
    for t in plan.transfers:
        shard = plan.shards[t.shard]
        assert (t.source is None) == (shard.units[0] >= 3)  # units 3, 4 = layers 2, 3
    assert math.isclose(plan.seconds, 2 * GB / LINKS.storage_bytes_per_s)
    # nobody holds the model: everything from storage
    empty: tuple[ReplicaPlacement, ...] = ()
    cold = switch_plan.plan(empty, tgt, MODEL, LINKS, remap=False)
    assert {t.tier for t in cold.transfers} == {device_links.STORAGE}
    assert math.isclose(cold.seconds, MODEL.total_bytes / LINKS.storage_bytes_per_s)
    assert math.isclose(switch_bound.bound(empty, cold, MODEL, LINKS).seconds, cold.seconds)


def test_held_shards_never_come_from_storage() -> None:
    model = ModelBytes(4, 1 * GB, embedding_bytes=0.5 * GB, lm_head_bytes=0.5 * GB)
    # a two-stage source on n0; the target replica lives on another node: all remote.
    src = (rep("a", ((0, 2), [("n0", 0)]), ((2, 4), [("n0", 1)])),)
    tgt = (whole("b", "n1", 0),)
    plan = switch_plan.plan(src, tgt, model, LINKS, remap=False)
    assert plan.bytes_from_storage == 0.0  # every shard is on some device
    assert math.isclose(plan.bytes_moved, model.total_bytes)
    assert {t.tier for t in plan.transfers} == {device_links.INTER}


def test_hand_case_with_known_optimum_where_greedy_is_twice_it() -> None:
    # Shard X (layers 0-1) is on A and B, shard Y (layers 2-3) only on A. Target T1 needs X,
    # T2 needs Y, all on one node. Greedy serves X first from A (tie, lowest device), then
    # Y must come from A too: A sends 4 GB. The optimum sends X from B: 2 GB per sender.
    a, b = ("n0", 0), ("n0", 1)
    src = (whole("r1", "n0", 0), rep("r2", ((0, 2), [b]), ((2, 4), [("n1", 0)])))
    assert src[0].stages[0].devices == (a,)
    tgt = (rep("t", ((0, 2), [("n0", 2)]), ((2, 4), [("n0", 3)])),)
    slow_remote = DeviceLinks(100 * GB, 1e-3 * GB, 1 * GB)  # remote copies are hopeless
    plan = switch_plan.plan(src, tgt, MODEL, slow_remote, remap=False)
    lower = switch_bound.bound(src, plan, MODEL, slow_remote)
    assert math.isclose(lower.seconds, 2 * GB / (100 * GB), rel_tol=1e-6)  # known optimum
    assert plan.seconds >= lower.seconds * (1 - 1e-9)
    # greedy: X from A (pair tie, egress tie, lowest device), Y from A (only local holder)
    assert math.isclose(plan.seconds, 4 * GB / (100 * GB))
    assert math.isclose(switch_bound.ratio(plan, lower), 2.0, rel_tol=1e-6)


def test_hand_case_where_greedy_is_optimal() -> None:
    # Two local holders, two targets each needing the whole model: one from each holder.
    src = (whole("a", "n0", 0), whole("b", "n0", 1))
    tgt = (whole("a", "n0", 0), whole("b", "n0", 1), whole("c", "n0", 2), whole("d", "n0", 3))
    plan = switch_plan.plan(src, tgt, MODEL, LINKS, remap=False)
    lower = switch_bound.bound(src, plan, MODEL, LINKS)
    assert math.isclose(plan.seconds, 4 * GB / (100 * GB))
    assert math.isclose(lower.seconds, plan.seconds, rel_tol=1e-6)


def test_remap_keeps_a_stage_in_place() -> None:
    # Source: one two-stage replica on n0:0,1. Target as given puts the same replica on
    # n0:2,3 (canonical placement of another layout): remapping moves nothing.
    src = (rep("a", ((0, 2), [("n0", 0)]), ((2, 4), [("n0", 1)])),)
    tgt = (rep("a", ((0, 2), [("n0", 2)]), ((2, 4), [("n0", 3)])),)
    pool = {"n0": (0, 1, 2, 3)}
    moved = switch_plan.plan(src, tgt, MODEL, LINKS, remap=False, pool=pool)
    kept = switch_plan.plan(src, tgt, MODEL, LINKS, remap=True, pool=pool)
    assert math.isclose(moved.bytes_moved, MODEL.total_bytes)
    assert kept.bytes_moved == 0.0
    assert dict(kept.mapping)[("n0", 2)] == ("n0", 0)


def test_target_too_big_for_the_pool_is_a_clear_error() -> None:
    src = (whole("a", "n0", 0),)
    tgt = (rep("b", ((0, 4), [("n9", 0), ("n9", 1)])),)
    with pytest.raises(fields.FieldError, match="needs more devices"):
        switch_plan.plan(src, tgt, MODEL, LINKS, pool={"n0": (0,)})


def test_a_device_in_two_stages_is_rejected() -> None:
    with pytest.raises(fields.FieldError, match="already holds"):
        switch_plan.plan((whole("a", "n0", 0), whole("b", "n0", 0)), (), MODEL, LINKS)


@st.composite
def placements(draw: st.DrawFn, nodes: int = 2, gpus: int = 4) -> tuple[ReplicaPlacement, ...]:
    """Random placements: replicas of 1-2 stages, tp in {1, 2, 4}, on free devices."""
    free = [(f"n{n}", i) for n in range(nodes) for i in range(gpus)]
    out = []
    for k in range(draw(st.integers(0, 4))):
        pp = draw(st.integers(1, 2))
        cut = draw(st.integers(1, 3))
        bounds = [(0, 4)] if pp == 1 else [(0, cut), (cut, 4)]
        stages = []
        for lay in bounds:
            tp = draw(st.sampled_from([1, 2, 4]))
            node = draw(st.sampled_from([f"n{n}" for n in range(nodes)]))
            local = [d for d in free if d[0] == node]
            if len(local) < tp:
                break
            chosen = local[:tp]
            for d in chosen:
                free.remove(d)
            stages.append(StagePlacement(lay, tuple(chosen)))
        if len(stages) == len(bounds):
            out.append(ReplicaPlacement(f"r{k}", tuple(stages)))
    return tuple(out)


@settings(max_examples=60, deadline=None)
@given(
    placements(),
    placements(),
    st.floats(1, 1000),
    st.floats(1, 1000),
    st.floats(0.1, 100),
    st.booleans(),
    st.sampled_from(switch_plan.RULES),
)
def test_greedy_never_beats_the_lp_bound(
    src: tuple[ReplicaPlacement, ...],
    tgt: tuple[ReplicaPlacement, ...],
    intra: float,
    inter: float,
    storage: float,
    remap: bool,
    rule: str,
) -> None:
    model = ModelBytes(4, 1 * GB, embedding_bytes=0.3 * GB, lm_head_bytes=0.2 * GB)
    link_model = DeviceLinks(intra * GB, inter * GB, storage * GB, device_bytes_per_s=500 * GB)
    pool = {"n0": (0, 1, 2, 3), "n1": (0, 1, 2, 3)}
    plan = switch_plan.plan(src, tgt, model, link_model, remap=remap, pool=pool, rule=rule)
    lower = switch_bound.bound(src, plan, model, link_model)
    assert plan.seconds >= lower.seconds * (1 - 1e-7) - 1e-12
    # every target byte is either in place or moved exactly once
    need = model.total_bytes * len(tgt)
    got = plan.bytes_in_place + plan.bytes_moved + plan.bytes_from_storage
    assert math.isclose(got, need, rel_tol=1e-9, abs_tol=1e-3)


def test_device_links_from_agent_level_figures() -> None:
    class Agent:  # the figures tessera.policies.links.LinkModel carries
        storage_bytes_per_s = 1e9
        network_bytes_per_s = 1.25e9
        local_bytes_per_s = 8e9

    made = device_links.from_agent_links(Agent())
    assert (made.intra_node_bytes_per_s, made.inter_node_bytes_per_s) == (8e9, 1.25e9)
    assert made.storage_bytes_per_s == 1e9
    with pytest.raises(fields.FieldError):
        DeviceLinks(0.0, 1.0, 1.0)
