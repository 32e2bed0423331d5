"""Copy sources of a transition's loads chosen by the switch plan (issue 11), no servers.

The layouts are the acceptance ones (`test_transition`): two whole replicas → one whole +
a 2-stage pipeline → the pipeline split at other layers on the other agents. With switch
sourcing every load's parameters come in parts: the same agent first, the rest from the
least-loaded peer, storage only for what no block holds; each peer part names the fastest
transport between the two agents; a peer is freed only after the loads that read it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings

from tessera import blocks
from tessera.policies import device_links, links
from tessera.policies.placement import ModelBytes
from tessera.policies.transition import actions
from tessera.policies.transition import copy_sources as switch_sources
from tessera.policies.transition import planner as transition
from tests.policies import test_transition as tt
from tests.policies import test_transition_properties as props
from tests.policies import transition_sim as sim

MB = ModelBytes(8, 10.0, 3.0, 4.0)
LINKS = device_links.from_agent_links(links.LinkModel())


def held(agent: str, b: blocks.Block, store: str = "s") -> switch_sources.Held:
    return switch_sources.Held(agent, f"{agent}:1", b, store)


def wanted(agent: str, b: blocks.Block, store: str = "s") -> switch_sources.Wanted:
    return switch_sources.Wanted(agent, f"{agent}:1", b, store)


def parts_of(got: switch_sources.Assignment, agent: str, b: blocks.Block) -> list[tuple[Any, str]]:
    return [(p.units, p.source.agent if p.source else "storage") for p in got.parts[(agent, b.key)]]


def test_moved_boundary_copies_layers_on_the_agent_and_the_rest_from_the_peer() -> None:
    r0 = sim.block("r0", 1, 0, 1, (0, 8), 80)
    p0, p1 = sim.block("r1", 2, 0, 2, (0, 4), 40), sim.block("r1", 2, 1, 2, (4, 8), 40)
    n0, n1 = sim.block("r1", 3, 0, 2, (0, 6), 60), sim.block("r1", 3, 1, 2, (6, 8), 20)
    got = switch_sources.assign(
        [held("a", r0), held("a", p0), held("b", p1)],
        [wanted("b", n0), wanted("a", n1)],
        MB,
        LINKS,
    )
    # [0, 6) on b: layers 4-5 (units 5-7) from b's own stage, the embedding and layers 0-3
    # (units 0-5) from agent a
    assert parts_of(got, "b", n0) == [((0, 5), "a"), ((5, 7), "b")]
    # [6, 8) on a: layers 6-7 and the head (units 7-10) from a's whole replica, in memory
    assert parts_of(got, "a", n1) == [((7, 10), "a")]
    local = got.parts[("a", n1.key)][0].source
    assert local is not None and local.replica_id == r0.replica_id
    assert local.transport == switch_sources.LOCAL
    assert got.parts[("b", n0.key)][0].source.transport == switch_sources.DATA_PLANE  # type: ignore[union-attr]
    assert got.plan is not None and got.plan.bytes_from_storage == 0
    lower = got.bound(LINKS)
    assert lower is not None and got.plan.seconds >= lower.seconds - 1e-12


def test_storage_only_for_what_no_block_holds() -> None:
    half = sim.block("r0", 1, 0, 2, (0, 4), 40)  # a stage whose other half was lost
    new = sim.block("r1", 2, 0, 1, (0, 8), 80)
    got = switch_sources.assign([held("a", half)], [wanted("b", new)], MB, LINKS)
    assert parts_of(got, "b", new) == [((0, 5), "a"), ((5, 10), "storage")]
    assert got.plan is not None and got.plan.bytes_from_storage == 4 * 10.0 + 4.0


def test_grpc_when_either_agent_has_no_data_plane() -> None:
    r0 = sim.block("r0", 1, 0, 1, (0, 8), 80)
    new = sim.block("r1", 2, 0, 1, (0, 8), 80)
    got = switch_sources.assign([held("a", r0, "")], [wanted("b", new)], MB, LINKS)
    src = got.parts[("b", new.key)][0].source
    assert src is not None and src.transport == switch_sources.GRPC
    assert switch_sources.transport("a", "x", "b", "y") == switch_sources.DATA_PLANE
    assert switch_sources.transport("a", "", "a", "") == switch_sources.LOCAL


def test_tensor_parallel_and_other_models_take_no_part() -> None:
    r0 = sim.block("r0", 1, 0, 1, (0, 8), 80)
    other = replace(sim.block("x", 1, 0, 1, (0, 8), 80), model_path="/other")
    tp = replace(sim.block("r1", 2, 0, 1, (0, 8), 40), tp_size=2, tp_rank=1)
    new = sim.block("r2", 2, 0, 1, (0, 8), 80)
    got = switch_sources.assign([held("b", other)], [wanted("a", tp), wanted("a", new)], MB, LINKS)
    assert ("a", tp.key) not in got.parts
    assert parts_of(got, "a", new) == [((0, 10), "storage")]
    assert switch_sources.assign([held("a", r0)], [wanted("a", tp)], MB, LINKS).plan is None


def _planned(c: sim.Cluster, target: list[transition.Placed], gen: int) -> transition.Transition:
    w = replace(c.world(), sourcing="switch", model=MB)
    return transition.plan(w, sim.target_of(target, gen))


def test_transition_loads_carry_the_plan_and_peers_outlive_their_readers() -> None:
    c = tt.started(32 * tt.MiB, 32 * tt.MiB)
    for target, gen in tt.SEQUENCE:
        t = _planned(c, target, gen)
        assert t.blocked is None and t.mode == "make-before-break"
        loads = [s for s in t.steps if isinstance(s.action, actions.LoadBlock)]
        assert loads and all(s.action.parts for s in loads)  # type: ignore[union-attr]
        for s in loads:
            a = s.action
            assert isinstance(a, actions.LoadBlock)
            for part in a.parts:
                assert part.source is not None  # every layer is held somewhere: no storage
                key = (part.source.replica_id, part.source.stage_index, 0)
                for u in t.steps:  # an unload of the source waits for this load
                    ua = u.action
                    if isinstance(ua, actions.UnloadBlock) and (ua.agent, ua.block.key) == (
                        part.source.agent,
                        key,
                    ):
                        assert s.id in u.after
        c = _applied(c, target, gen)


def _applied(c: sim.Cluster, target: list[transition.Placed], gen: int) -> sim.Cluster:
    ids = [p.block.replica_id for p in target if p.block.stage_index == 0]
    fresh = sim.Cluster({n: sim.Agent(n, a.capacity) for n, a in c.agents.items()})
    sim.load_state(fresh, target, list(dict.fromkeys(ids)), gen)
    return fresh


def test_storage_sourcing_reads_every_block() -> None:
    c = tt.started(32 * tt.MiB, 32 * tt.MiB)
    w = replace(c.world(), sourcing="storage")
    t = transition.plan(w, sim.target_of(tt.WHOLE_AND_PIPE, 2))
    loads = [s.action for s in t.steps if isinstance(s.action, actions.LoadBlock)]
    assert loads and all(a.source is None and not a.parts for a in loads)


def test_target_placed_where_its_parameters_already_are() -> None:
    r0 = sim.block("r0", 1, 0, 1, (0, 8), 80)
    r1 = sim.block("r1", 1, 0, 1, (0, 8), 80)
    pipe0, pipe1 = sim.block("r1", 2, 0, 2, (0, 4), 40), sim.block("r1", 2, 1, 2, (4, 8), 40)
    # the planner put the new pipeline on the empty agent c and on a; b holds all of it
    mapping = switch_sources.map_target(
        [held("a", r0), held("b", r1)],
        [wanted("a", r0), wanted("c", pipe0), wanted("a", pipe1)],
        MB,
        pool={"a": ["cpu:0"], "b": ["cpu:0"], "c": ["cpu:0"]},
    )
    # a keeps r0 in place only if the pipeline's stage 1 goes with it, so the best
    # relabelling keeps a and moves the stage from c to b (which holds layers 0-3)
    assert mapping[("a", "cpu:0")] == ("a", "cpu:0")
    assert mapping[("c", "cpu:0")] == ("b", "cpu:0")
    # nothing to gain: the identity
    same = switch_sources.map_target([held("a", r0)], [wanted("a", r0)], MB)
    assert same == {("a", "cpu:0"): ("a", "cpu:0")}


@settings(max_examples=80, deadline=None)
@given(before=props.layouts(), after=props.layouts())
def test_parts_cover_each_block_once_from_holders_and_storage_only_when_none(
    before: list[tuple[str, tuple[tuple[str, int, int], ...]]],
    after: list[tuple[str, tuple[tuple[str, int, int], ...]]],
) -> None:
    old = props._placed(before, {name: 1 for name, _ in before})
    new = props._placed(after, {name: 2 for name, _ in after})
    got = switch_sources.assign(
        [held(p.agent, p.block) for p in old], [wanted(p.agent, p.block) for p in new], MB, LINKS
    )
    have = {(p.agent, p.block.replica_id, p.block.stage_index): p.block for p in old}
    held_units = [switch_sources.units_of(p.block, 8) for p in old]
    for p in new:
        parts = got.parts[(p.agent, p.block.key)]
        covered = [u for part in parts for u in range(*part.units)]
        assert covered == list(range(*switch_sources.units_of(p.block, 8)))  # once, in order
        for part in parts:
            if part.source is None:  # storage: no block holds any of these units
                assert not any(a <= u < b for u in range(*part.units) for a, b in held_units)
                continue
            src = have[(part.source.agent, part.source.replica_id, part.source.stage_index)]
            a, b = switch_sources.units_of(src, 8)
            assert a <= part.units[0] and part.units[1] <= b
            local = part.source.agent == p.agent
            assert (part.source.transport == switch_sources.LOCAL) == local
            if not local:  # the same agent first: none of its blocks holds these units
                mine = [switch_sources.units_of(q.block, 8) for q in old if q.agent == p.agent]
                assert not any(a <= u < b for u in range(*part.units) for a, b in mine)
