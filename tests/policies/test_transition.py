"""The transition planner, without servers: make-before-break, the freeing order,
idempotence, resuming from any intermediate state, peers, drains and impossible moves.

The scenario is the acceptance one: two whole replicas → one whole + one two-stage
pipeline → a pipeline split at other layers → back. A simulated cluster
(`transition_sim.Cluster`) applies the steps, failing a load that does not fit and
counting as lost any unload of a replica still routed or still running requests.
"""

from __future__ import annotations

import pytest

from tessera import observed, routes_doc
from tessera.policies import links
from tessera.policies.transition import actions
from tessera.policies.transition import planner as transition
from tests.policies import transition_sim as sim
from tests.policies.transition_sim import block, placed, rid, with_next

MiB = 1 << 20
L = MiB  # parameter bytes per layer; a whole replica holds 8 L + 2 L of KV


def whole(name: str, gen: int, agent: str) -> list[transition.Placed]:
    return [placed(agent, block(name, gen, 0, 1, (0, 8), 8 * L))]


def pipe(name: str, gen: int, split: int, a: str = "a", b: str = "b") -> list[transition.Placed]:
    return [
        with_next(placed(a, block(name, gen, 0, 2, (0, split), split * L)), f"{b}:1"),
        placed(b, block(name, gen, 1, 2, (split, 8), (8 - split) * L)),
    ]


TWO_WHOLE = whole("r0", 1, "a") + whole("r1", 1, "b")
WHOLE_AND_PIPE = whole("r0", 1, "a") + pipe("r1", 2, 4)
RESPLIT = whole("r0", 1, "a") + pipe("r1", 3, 6)
BACK = whole("r0", 1, "a") + whole("r1", 4, "b")
SEQUENCE = [(WHOLE_AND_PIPE, 2), (RESPLIT, 3), (BACK, 4)]


def started(capacity_a: int, capacity_b: int) -> sim.Cluster:
    c = sim.Cluster({"a": sim.Agent("a", capacity_a), "b": sim.Agent("b", capacity_b)})
    c.resize_kv = False  # the freeing order (shrinking pools: test_transition_shrink.py)
    sim.load_state(c, TWO_WHOLE, [rid("r0", 1), rid("r1", 1)], 1)
    return c


def kinds(t: transition.Transition) -> list[str]:
    return [s.action.kind for s in t.steps]


def index(t: transition.Transition, kind: str, replica: str = "") -> list[int]:
    out = []
    for s in t.steps:
        a = s.action
        r = getattr(a, "replica_id", "") or getattr(getattr(a, "block", None), "replica_id", "")
        if a.kind == kind and (not replica or r == replica):
            out.append(s.id)
    return out


# -- make-before-break ---------------------------------------------------------------------


def test_make_before_break_when_memory_allows() -> None:
    c = started(32 * MiB, 32 * MiB)
    t = transition.plan(c.world(), sim.target_of(WHOLE_AND_PIPE, 2))
    assert t.mode == "make-before-break" and t.blocked is None
    loads, cut = index(t, "LoadBlock"), index(t, "CutOver")
    unloads, drains = index(t, "UnloadBlock"), index(t, "Drain")
    assert len(loads) == 2 and len(cut) == 1 and drains and len(unloads) == 1
    # every load before the cut-over, the cut-over before the drain, the drain before freeing
    assert max(loads) < cut[0] < drains[0] < unloads[0]
    cut_step = t.steps[cut[0]]
    assert set(loads) <= set(cut_step.after)
    assert isinstance(cut_step.action, actions.CutOver)
    assert cut_step.action.leaving == (rid("r1", 1),)
    assert cut_step.action.version == 2
    assert [r.id for r in cut_step.action.replicas] == [rid("r0", 1), rid("r1", 2)]
    assert drains[0] in t.steps[unloads[0]].after
    # the last stage is loaded before the stage that points at it
    first = t.steps[loads[0]].action
    assert isinstance(first, actions.LoadBlock) and first.block.stage_index == 1
    assert t.peak_bytes > max(t.start_bytes, t.end_bytes)  # both layouts held at once


def test_the_acceptance_sequence_loses_nothing_and_serves_throughout() -> None:
    c = started(32 * MiB, 32 * MiB)
    for layout, gen in SEQUENCE:
        c.running = {rid("r1", gen - 1): 3}  # requests in flight on the replica that goes
        target = sim.target_of(layout, gen)
        while not transition.plan(c.world(), target).converged:
            assert c.serving(), "no complete replica routed"
            c.run(target, one=True)
        assert c.serving() == {r.id for r in target.replicas}
    assert c.lost == []
    assert sorted(c.agents["b"].blocks) == [(rid("r1", 4), 0, 0)]


# -- freeing order -------------------------------------------------------------------------


def test_freeing_order_when_memory_is_short() -> None:
    # b holds the old whole r1 (10 MiB) but not also the new stage [4, 8) (5 MiB)
    c = started(32 * MiB, 12 * MiB)
    t = transition.plan(c.world(), sim.target_of(WHOLE_AND_PIPE, 2))
    assert t.mode == "freeing-order" and t.blocked is None
    cuts, drains = index(t, "CutOver"), index(t, "Drain", rid("r1", 1))
    unload = index(t, "UnloadBlock", rid("r1", 1))
    load_b = next(
        s.id for s in t.steps if isinstance(s.action, actions.LoadBlock) and s.action.agent == "b"
    )
    # r1 leaves the routes (r0 keeps serving), drains, is freed, and only then b loads
    first_cut = t.steps[cuts[0]].action
    assert isinstance(first_cut, actions.CutOver)
    assert [r.id for r in first_cut.replicas] == [rid("r0", 1)]
    assert first_cut.leaving == (rid("r1", 1),)
    assert cuts[0] < drains[0] < unload[0] < load_b
    assert unload[0] in t.steps[load_b].after
    # the copy source cannot be the block freed before the load
    b_load = t.steps[load_b].action
    assert isinstance(b_load, actions.LoadBlock)
    assert b_load.source is None or b_load.source.replica_id != rid("r1", 1)
    # then the final cut-over adds the new replica
    last_cut = t.steps[cuts[-1]].action
    assert isinstance(last_cut, actions.CutOver)
    assert [r.id for r in last_cut.replicas] == [rid("r0", 1), rid("r1", 2)]
    assert t.peak_bytes <= 32 * MiB + 12 * MiB


def test_freeing_order_sequence_loses_nothing() -> None:
    c = started(32 * MiB, 12 * MiB)
    for layout, gen in SEQUENCE:
        c.running = {rid("r1", gen - 1): 2}
        target = sim.target_of(layout, gen)
        while not transition.plan(c.world(), target).converged:
            assert c.serving(), "no complete replica routed"
            c.run(target, one=True)
    assert c.lost == []
    assert c.peak <= 44 * MiB


def test_impossible_transition_is_blocked_and_touches_nothing_serving() -> None:
    # one replica only, on a device that cannot hold it twice: no replica could serve
    c = sim.Cluster({"a": sim.Agent("a", 12 * MiB), "b": sim.Agent("b", 6 * MiB)})
    sim.load_state(c, whole("r0", 1, "a"), [rid("r0", 1)], 1)
    target = sim.target_of(pipe("r0", 2, 6), 2)
    t = transition.plan(c.world(), target)
    assert t.mode == "blocked" and t.blocked is not None
    assert t.blocked.reason == "InsufficientMemory"
    assert "a/cpu:0" in t.blocked.message and rid("r0", 2) in t.blocked.message
    assert t.steps == ()


def test_no_source_when_storage_is_unreadable_and_no_peer_holds_the_layers() -> None:
    c = sim.Cluster({"a": sim.Agent("a", 64 * MiB), "b": sim.Agent("b", 64 * MiB)})
    c.checkpoint_readable = False
    t = transition.plan(c.world(), sim.target_of(whole("r0", 1, "a"), 1))
    assert t.blocked is not None and t.blocked.reason == "NoSource"
    # but a peer holding the layers is enough
    sim.load_state(c, whole("r0", 1, "a"), [rid("r0", 1)], 1)
    t = transition.plan(c.world(), sim.target_of(whole("r0", 1, "a") + whole("r1", 2, "b"), 2))
    assert t.blocked is None
    load = t.steps[index(t, "LoadBlock")[0]].action
    assert isinstance(load, actions.LoadBlock) and load.source is not None


# -- idempotence and resuming ----------------------------------------------------------------


def test_converged_system_plans_nothing() -> None:
    c = started(32 * MiB, 32 * MiB)
    t = transition.plan(c.world(), sim.target_of(TWO_WHOLE, 1))
    assert t.converged and t.mode == "converged" and t.steps == ()
    c.run(sim.target_of(WHOLE_AND_PIPE, 2))
    again = transition.plan(c.world(), sim.target_of(WHOLE_AND_PIPE, 2))
    assert again.converged


@pytest.mark.parametrize("capacity_b", [32 * MiB, 12 * MiB], ids=["mbb", "freeing"])
@pytest.mark.parametrize("which", range(len(SEQUENCE)))
def test_resumes_from_every_intermediate_state(capacity_b: int, which: int) -> None:
    """Stop after k steps of the full plan (an operator killed there), re-plan from the
    observation, finish: the same end state, nothing lost, no step repeated."""
    base = started(32 * MiB, capacity_b)
    for layout, gen in SEQUENCE[:which]:
        base.run(sim.target_of(layout, gen))
    layout, gen = SEQUENCE[which]
    target = sim.target_of(layout, gen)
    full = transition.plan(base.world(), target)
    assert full.blocked is None and full.steps
    end_state = None
    for k in range(len(full.steps) + 1):
        c = started(32 * MiB, capacity_b)
        for lay, g in SEQUENCE[:which]:
            c.run(sim.target_of(lay, g))
        c.running = {rid("r1", gen - 1): 1}
        done = 0
        for s in full.steps[:k]:  # apply the original plan's first k steps, in order
            if not c.apply(s.action):
                c.now += 3.0
                c.running.clear()
                assert c.apply(s.action)
            done += 1
        rest = transition.plan(c.world(), target)
        assert rest.blocked is None
        # what is left is never more work than what was planned minus what was done
        assert _work(rest) <= _work(full) - _work_of(full.steps[:k])
        c.run(target)
        assert c.lost == []
        state = {n: sorted(a.blocks) for n, a in c.agents.items()}
        assert c.published is not None
        routed = c.published.replica_ids
        end_state = end_state or (state, routed)
        assert (state, routed) == end_state


def _work_of(steps: tuple[actions.Step, ...]) -> int:
    return sum(isinstance(s.action, actions.LoadBlock | actions.UnloadBlock) for s in steps)


def _work(t: transition.Transition) -> int:
    return _work_of(t.steps)


# -- peers, drains, rewiring -------------------------------------------------------------------


def test_peer_source_when_the_link_beats_storage() -> None:
    c = started(32 * MiB, 32 * MiB)
    t = transition.plan(c.world(), sim.target_of(WHOLE_AND_PIPE, 2))
    by_agent = {s.action.agent: s for s in t.steps if isinstance(s.action, actions.LoadBlock)}
    # b's new stage [4, 8) copies from the old whole r1 on b itself; a's from r0
    b_load = by_agent["b"].action
    assert isinstance(b_load, actions.LoadBlock) and b_load.source is not None
    assert b_load.source.replica_id == rid("r1", 1)
    # ... so the old r1 is freed only after that copy
    free_r1 = index(t, "UnloadBlock", rid("r1", 1))[0]
    assert by_agent["b"].id in t.steps[free_r1].after
    # with storage faster than any link, no peer is used
    c.links = links.LinkModel(storage_bytes_per_s=1e15)
    t = transition.plan(c.world(), sim.target_of(WHOLE_AND_PIPE, 2))
    assert all(s.action.source is None for s in t.steps if isinstance(s.action, actions.LoadBlock))


def test_cross_agent_copy_follows_the_link_model() -> None:
    c = sim.Cluster({"a": sim.Agent("a", 64 * MiB), "b": sim.Agent("b", 64 * MiB)})
    sim.load_state(c, whole("r0", 1, "a"), [rid("r0", 1)], 1)
    target = sim.target_of(whole("r0", 1, "a") + whole("r1", 2, "b"), 2)
    fast = links.LinkModel(storage_bytes_per_s=1e8, pairs={("a", "b"): 1e10})
    slow = links.LinkModel(storage_bytes_per_s=1e9, pairs={("a", "b"): 1e7})
    for model, peer in ((fast, True), (slow, False)):
        c.links = model
        t = transition.plan(c.world(), target)
        load = t.steps[index(t, "LoadBlock")[0]].action
        assert isinstance(load, actions.LoadBlock) and (load.source is not None) == peer


def test_drained_waits_for_idle_or_deadline() -> None:
    c = started(32 * MiB, 32 * MiB)
    r1 = rid("r1", 1)
    assert not transition.drained(c.world(), r1)  # still routed
    c.apply(actions.CutOver(2, (routes_doc.RouteReplica(rid("r0", 1), "a:1"),), (r1,), 10.0))
    c.running = {r1: 1}
    assert not transition.drained(c.world(), r1)  # requests in flight
    c.running = {}
    assert not transition.drained(c.world(), r1)  # idle, but the gateway may not know yet
    c.now += 2.5
    assert transition.drained(c.world(), r1)
    c.running = {r1: 4}
    c.now += 10.0 + 5.0
    assert transition.drained(c.world(), r1)  # deadline plus grace: given up on


def test_unrouted_leftovers_are_freed_first_even_when_blocked() -> None:
    c = started(32 * MiB, 32 * MiB)
    stale = pipe("r1", 7, 4)
    for p in stale:  # a half-finished earlier transition's blocks, never routed
        c.agents[p.agent].blocks[p.block.key] = p.block
    c.agents["b"].reachable = False
    t = transition.plan(c.world(), sim.target_of(whole("r0", 1, "a") + pipe("r1", 8, 2), 8))
    assert t.blocked is not None and t.blocked.reason == "AgentUnreachable"
    assert kinds(t) == ["Drain", "UnloadBlock"]  # only what a reaches, nothing routed
    assert t.steps[1].action.block.replica_id == rid("r1", 7)  # type: ignore[union-attr]


def test_rewire_when_only_the_next_address_changes() -> None:
    c = sim.Cluster({"a": sim.Agent("a", 64 * MiB), "b": sim.Agent("b", 64 * MiB)})
    sim.load_state(c, pipe("r0", 1, 4), [rid("r0", 1)], 1)
    moved = [with_next(pipe("r0", 1, 4)[0], "b:2"), pipe("r0", 1, 4)[1]]
    t = transition.plan(c.world(), sim.target_of(moved, 1))
    assert kinds(t) == ["Rewire"]
    c.run(sim.target_of(moved, 1))
    assert c.agents["a"].blocks[(rid("r0", 1), 0, 0)].next_address == "b:2"


def test_observed_blocks_of_other_deployments_are_never_touched() -> None:
    c = started(32 * MiB, 32 * MiB)
    other = block("x", 1, 0, 1, (0, 8), 8 * L)
    foreign = other.__class__(**{**other.__dict__, "replica_id": "default.other.x.g1"})
    c.agents["a"].blocks[foreign.key] = foreign
    t = transition.plan(c.world(), sim.target_of(WHOLE_AND_PIPE, 2))
    for s in t.steps:
        if isinstance(s.action, actions.UnloadBlock):
            assert s.action.block.replica_id.startswith(sim.PREFIX)


def test_complete_replicas_needs_every_stage() -> None:
    half = pipe("r1", 2, 4)[:1]
    obs = observed.Observed(
        (observed.AgentInfo("a", "a:1", True, (), tuple(p.block for p in half)),)
    )
    assert transition.complete_replicas(obs, sim.PREFIX) == set()
