"""Drop-style transitions (issue 34): where even shrunk pools leave no room for the new
layout's parameters, whole replicas drop replicated layers into one pipeline (KunServe's
drop) and the pipeline's grown pool then shrinks to let the new layout in.

Two agents at 100 % of their memory, each with a whole replica (8 MiB of parameters, the
rest KV). The target is one replica over both agents whose stage on `a` cannot fit beside
a whole replica even with its pool at the floor, and the freeing order can only retire
one of the two. `transition_sim.Cluster` fails what does not fit and counts as lost every
request of a replica unloaded or dropped while routed or busy.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tessera import blocks
from tessera.policies.transition import actions
from tessera.policies.transition import drop as transition_drop
from tessera.policies.transition import planner as transition
from tests.policies import transition_sim as sim
from tests.policies.transition_sim import placed, rid, with_next

MiB = 1 << 20
CAP = 12 * MiB  # per agent: 8 MiB of parameters, 4 MiB of KV (25 pages of 8 layers)


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


def full_cluster(used: int = 5, running: int = 2) -> sim.Cluster:
    c = sim.Cluster({n: sim.Agent(n, CAP) for n in ("a", "b")})
    whole = [
        placed("a", blk("r0", 1, 0, 1, (0, 8), CAP - 8 * MiB)),
        placed("b", blk("r1", 1, 0, 1, (0, 8), CAP - 8 * MiB)),
    ]
    sim.load_state(c, whole, [rid("r0", 1), rid("r1", 1)], 1)
    c.used = {rid("r0", 1): used, rid("r1", 1): used}
    c.running = {rid("r0", 1): running, rid("r1", 1): running}
    assert c.agents["a"].free == c.agents["b"].free == 0
    return c


def target() -> transition.Target:
    """One replica: [0, 4) on b, [4, 8) on a: 4 MiB of parameters beside a whole
    replica's 8 MiB leave no KV at all, on either agent."""
    return sim.target_of(
        [
            with_next(placed("b", blk("p", 2, 0, 2, (0, 4), 3 * MiB)), "a:1"),
            placed("a", blk("p", 2, 1, 2, (4, 8), 3 * MiB)),
        ],
        2,
    )


def test_without_drops_the_switch_is_insufficient_memory() -> None:
    c = full_cluster()
    t = transition.plan(replace(c.world(), drop_layers=False), target())
    assert t.blocked is not None and t.blocked.reason == "InsufficientMemory"


def test_drop_plan_cuts_a_donor_out_drains_it_and_drops() -> None:
    c = full_cluster()
    t = transition.plan(c.world(), target())
    assert t.blocked is None and t.mode == "drop-layers"
    kinds = [s.action.kind for s in t.steps]
    assert kinds == ["CutOver", "Drain", "DropLayers"]
    cut, drain, drop = (s.action for s in t.steps)
    assert isinstance(cut, actions.CutOver) and cut.leaving == (rid("r1", 1),)
    assert [r.id for r in cut.replicas] == [rid("r0", 1)]  # the head keeps serving
    assert isinstance(drain, actions.Drain) and drain.replica_id == rid("r1", 1)
    assert isinstance(drop, actions.DropLayers)
    assert drop.head == rid("r0", 1) and drop.donors == (rid("r1", 1),)
    assert [(s.agent, s.start, s.end) for s in drop.stages] == [("a", 0, 4), ("b", 4, 8)]
    assert t.steps[2].after == (1,) and t.steps[1].after == (0,)
    assert t.peak_bytes == t.start_bytes  # a drop loads nothing


def test_runs_to_the_target_losing_nothing() -> None:
    c = full_cluster()
    start = c.ours()
    c.run(target())
    assert c.lost == []
    assert c.published is not None and c.published.replica_ids == (rid("p", 2),)
    held = {(n, k) for n, a in c.agents.items() for k in a.blocks}
    assert held == {("b", (rid("p", 2), 0, 0)), ("a", (rid("p", 2), 1, 0))}
    # every switch after the drop stays within the incoming layout's parameters
    assert c.peak - start <= 8 * MiB
    assert transition.plan(c.world(), target()).converged


def _trajectory(c: sim.Cluster) -> list[actions.Action]:
    """The actions a run applies, in order (drains that had to wait included)."""
    out: list[actions.Action] = []
    apply = c.apply

    def record(a: actions.Action) -> bool:
        out.append(a)
        return apply(a)

    c.apply = record  # type: ignore[method-assign]
    c.run(target())
    return out


def _replay(c: sim.Cluster, done: list[actions.Action]) -> None:
    for a in done:
        if not c.apply(a):
            c.now += 3.0
            c.running.clear()


@pytest.mark.parametrize("used", [0, 5, 15])
def test_resumes_from_every_intermediate_state(used: int) -> None:
    """Stop after any k applied actions (an operator killed there), re-plan from the
    observation and finish: nothing lost and the same end state, for every k."""
    path = _trajectory(full_cluster(used))
    assert any(isinstance(a, actions.DropLayers) for a in path)
    assert any(isinstance(a, actions.ResizeKV) and a.shrink for a in path)
    ends = set()
    for k in range(len(path) + 1):
        c = full_cluster(used)
        _replay(c, path[:k])
        rest = transition.plan(c.world(), target())
        assert rest.blocked is None, (k, rest.blocked)
        c.run(target())
        assert c.lost == [], (k, c.lost)
        ends.add(tuple(sorted((n, k) for n, a in c.agents.items() for k in a.blocks)))
    assert len(ends) == 1


def test_no_drop_when_the_pipeline_would_not_make_room_either() -> None:
    c = full_cluster()
    huge = sim.target_of([placed("a", blk("p", 2, 0, 1, (0, 8), 3 * MiB))], 2)
    bigger = transition.Target(
        2,
        tuple(
            transition.Placed(
                p.agent, p.address, blocks.Block(**{**p.block.__dict__, "param_bytes": 13 * MiB})
            )
            for p in huge.blocks
        ),
        huge.replicas,
    )
    t = transition.plan(c.world(), bigger)
    assert t.blocked is not None and t.blocked.reason == "InsufficientMemory"


def test_one_whole_replica_alone_has_nothing_replicated_to_drop() -> None:
    c = full_cluster()
    del c.agents["b"].blocks[(rid("r1", 1), 0, 0)]
    c.agents["b"].capacity = 0  # nothing free there either
    assert transition_drop.wholes(c.world(), target())[0].replica_id == rid("r0", 1)
    t = transition.plan(c.world(), target())
    assert t.blocked is not None


def test_after_drop_is_what_the_agents_report() -> None:
    c = full_cluster()
    w = c.world()
    found = transition_drop.wholes(w, target())
    members = [(found[0], 0, 4), (found[1], 4, 8)]
    after = transition_drop.after_drop(w, members)
    c.apply(actions.CutOver(1, (c.published.replicas[0],), (rid("r1", 1),)))  # type: ignore[union-attr]
    c.running.clear()
    stages = tuple(
        actions.DropStage(m.replica_id, m.placed.agent, m.placed.address, s, e)
        for m, s, e in members
    )
    c.apply(actions.DropLayers(stages))
    real = c.world()

    def blocks_of(x: transition.World) -> list[blocks.Block]:
        return sorted((b for a in x.observed.agents for b in a.blocks), key=lambda b: b.key)

    assert blocks_of(after) == blocks_of(real)
    assert [k.pages_total for a in after.observed.agents for k in a.kv] == [
        k.pages_total for a in real.observed.agents for k in a.kv
    ]
