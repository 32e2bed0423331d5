"""Transitions on a full device: the serving replica's KV pool shrinks, the new layout
loads beside it, the routes cut over, the old is freed and the new pool grows (issue 34).

Every agent's memory is 100 % used (the KV pool took all that the parameters left), so
make-before-break has no room and the freeing order has no second replica to serve.
`transition_sim.Cluster` fails a load or a grow that does not fit, a shrink below the
pages the requests hold, and counts any unload of a routed or busy replica as lost.
"""

from __future__ import annotations

import pytest

from tessera import blocks
from tessera.policies.transition import actions
from tessera.policies.transition import planner as transition
from tessera.policies.transition import shrink as transition_shrink
from tests.policies import transition_sim as sim
from tests.policies.transition_sim import placed, rid, with_next

MiB = 1 << 20
CAP = 24 * MiB  # per agent: 8 MiB of parameters, 16 MiB of KV


def blk(name: str, gen: int, stage: int, n: int, layers: tuple[int, int], kv: int) -> blocks.Block:
    return blocks.Block(
        sim.MODEL,
        layers[0],
        layers[1],
        replica_id=rid(name, gen),
        stage_index=stage,
        num_stages=n,
        generation=gen,
        param_bytes=(layers[1] - layers[0]) * MiB,
        kv_bytes=kv,
    )


def one_whole_on_a() -> list[transition.Placed]:
    return [placed("a", blk("r0", 1, 0, 1, (0, 8), CAP - 8 * MiB))]


def two_stages_on_a(gen: int) -> list[transition.Placed]:
    """The incoming layout: the same agent, split in two stages (8 MiB of KV each)."""
    return [
        with_next(placed("a", blk("r0", gen, 0, 2, (0, 4), 6 * MiB)), "a:1"),
        placed("a", blk("r0", gen, 1, 2, (4, 8), 6 * MiB)),
    ]


def full_cluster(used: int = 30, running: int = 2) -> sim.Cluster:
    c = sim.Cluster({"a": sim.Agent("a", CAP)})
    sim.load_state(c, one_whole_on_a(), [rid("r0", 1)], 1)
    c.used = {rid("r0", 1): used}
    c.running = {rid("r0", 1): running}
    assert c.agents["a"].free == 0
    return c


def test_make_before_break_is_impossible_without_shrinking() -> None:
    c = full_cluster()
    c.resize_kv = False
    t = transition.plan(c.world(), sim.target_of(two_stages_on_a(2), 2))
    assert t.blocked is not None and t.blocked.reason == "InsufficientMemory"


def test_shrink_load_cut_over_free_grow() -> None:
    c = full_cluster()
    t = transition.plan(c.world(), sim.target_of(two_stages_on_a(2), 2))
    assert t.blocked is None and t.mode == "shrink-pools"
    kinds = [s.action.kind for s in t.steps]
    assert kinds[0] == "ResizeKV" and kinds[-1] == "ResizeKV"
    first, last = t.steps[0].action, t.steps[-1].action
    assert isinstance(first, actions.ResizeKV) and first.shrink
    assert first.replica_id == rid("r0", 1) and first.num_pages == 34  # 30 held + 10 % + 1
    assert isinstance(last, actions.ResizeKV) and not last.shrink
    assert last.replica_id == rid("r0", 2)
    loads = [s for s in t.steps if isinstance(s.action, actions.LoadBlock)]
    assert all(0 in s.after or s.after for s in loads)  # every load waits for the shrink
    unload = next(s.id for s in t.steps if isinstance(s.action, actions.UnloadBlock))
    assert unload in t.steps[-1].after  # the new pool grows only once the old is freed
    # the extra memory at the peak is at most the incoming layout's parameters
    assert t.peak_bytes - t.start_bytes <= 8 * MiB


def test_runs_to_the_target_losing_nothing() -> None:
    c = full_cluster()
    target = sim.target_of(two_stages_on_a(2), 2)
    start = c.ours()
    c.run(target)
    assert c.lost == []
    assert c.published is not None and c.published.replica_ids == (rid("r0", 2),)
    held = c.agents["a"].blocks
    assert sorted(held) == [(rid("r0", 2), 0, 0), (rid("r0", 2), 1, 0)]
    assert [b.kv_bytes for b in held.values()] == [6 * MiB, 6 * MiB]  # grown back
    assert c.peak - start <= 8 * MiB  # extra_bytes_peak <= the incoming weights
    assert transition.plan(c.world(), target).converged


@pytest.mark.parametrize("used", [0, 20, 40])
def test_resumes_from_every_intermediate_state(used: int) -> None:
    """Stop after k steps (an operator killed there), re-plan from the observation and
    finish: the same end state and nothing lost, for every k."""
    target = sim.target_of(two_stages_on_a(2), 2)
    full = transition.plan(full_cluster(used).world(), target)
    assert full.blocked is None and full.steps
    ends = set()
    for k in range(len(full.steps) + 1):
        c = full_cluster(used)
        for s in full.steps[:k]:
            if not c.apply(s.action):
                c.now += 3.0
                c.running.clear()
                assert c.apply(s.action)
        rest = transition.plan(c.world(), target)
        assert rest.blocked is None, (k, rest.blocked)
        c.run(target)
        assert c.lost == []
        held = c.agents["a"].blocks
        ends.add((tuple(sorted(held)), tuple(b.kv_bytes for b in held.values())))
    assert len(ends) == 1


def test_waits_while_requests_hold_the_pages() -> None:
    # 95 of 100 pages held: the floor leaves no KV room for the new layout
    c = full_cluster(used=95)
    target = sim.target_of(two_stages_on_a(2), 2)
    t = transition.plan(c.world(), target)
    assert t.blocked is not None and t.blocked.reason == "WaitingForKV"
    assert rid("r0", 1) in t.blocked.message and t.steps == ()
    c.used = {rid("r0", 1): 20}  # requests finished: the next pass proceeds
    c.run(target)
    assert c.lost == []


def test_parameters_that_cannot_fit_are_insufficient_memory() -> None:
    c = full_cluster(used=0, running=0)
    big = [placed("a", blk("r0", 2, 0, 1, (0, 8), 20 * MiB))]
    big = [
        transition.Placed(
            p.agent, p.address, blocks.Block(**{**p.block.__dict__, "param_bytes": 30 * MiB})
        )
        for p in big
    ]
    t = transition.plan(c.world(), sim.target_of(big, 2))
    assert t.blocked is not None and t.blocked.reason == "InsufficientMemory"


def test_floor_keeps_what_requests_hold() -> None:
    from tessera import observed

    load = observed.ReplicaLoad("x", 100, 40, running=3)
    assert transition_shrink.floor_pages(load, 0.1) == 45
    assert transition_shrink.floor_pages(observed.ReplicaLoad("x", 100, 0), 0.1) == 1
    assert transition_shrink.floor_pages(observed.ReplicaLoad("x", 10, 40), 0.1) == 10


def test_shrinking_comes_before_the_freeing_order() -> None:
    """Two whole replicas, b short for the new stage beside its old replica: its pool
    gives up the room, so no replica leaves the routes before the new one serves."""
    from tests.policies import test_transition as tt

    c = tt.started(32 * MiB, 14 * MiB)
    c.resize_kv = True
    target = sim.target_of(tt.WHOLE_AND_PIPE, 2)
    t = transition.plan(c.world(), target)
    assert t.blocked is None and t.mode == "shrink-pools"
    cuts = [s for s in t.steps if isinstance(s.action, actions.CutOver)]
    assert len(cuts) == 1  # the freeing order would cut r1 out first
    assert cuts[0].id > max(s.id for s in t.steps if isinstance(s.action, actions.LoadBlock))
    c.running = {rid("r1", 1): 2}
    c.run(target)
    assert c.lost == []
    c.resize_kv = False
    assert transition.plan(tt.started(32 * MiB, 14 * MiB).world(), target).mode == "freeing-order"
