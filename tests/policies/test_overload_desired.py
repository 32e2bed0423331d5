"""`policies.overload_desired`: reconcile keeps an active overload drop instead of undoing it.

Two whole replicas r0 (agent a) and r1 (agent b); the overload loop made them one
pipeline served as r0: a holds r0 [0, 4) as stage 0 of 2, b holds r1's block renamed
r0 [4, 8) as stage 1, and r1 left the routes. With the policy disabled the transition
planner undoes that (unloads and reloads); enabled, it plans nothing (or only the
routes cut-over the loop's own routes step does, and a drain of the donor's id), and
after the restore the plan's target is unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from tessera import dtypes, routes_doc
from tessera.policies.overload import desired as overload_desired
from tessera.policies.transition import actions, generation
from tessera.policies.transition import planner as transition
from tests.policies import transition_sim as sim
from tests.policies.transition_sim import block, placed, rid, with_next

L = 1 << 20
TWO_WHOLE = [
    placed("a", block("r0", 1, 0, 1, (0, 8), 8 * L)),
    placed("b", block("r1", 1, 0, 1, (0, 8), 8 * L)),
]
DROPPED = [
    with_next(placed("a", block("r0", 1, 0, 2, (0, 4), 4 * L)), "b:1"),
    placed("b", block("r0", 1, 1, 2, (4, 8), 4 * L)),
]
TARGET = sim.target_of(TWO_WHOLE, 1)
TARGET_ROUTES = routes_doc.RoutesDoc(TARGET.replicas, 1)


def cluster(state: list[transition.Placed], routed: list[str]) -> sim.Cluster:
    c = sim.Cluster({"a": sim.Agent("a", 64 * L), "b": sim.Agent("b", 64 * L)})
    sim.load_state(c, state, routed, 1)
    return c


def kinds(t: transition.Transition) -> list[str]:
    return [s.action.kind for s in t.steps]


def test_disabled_a_drop_is_drift_that_reconcile_undoes() -> None:
    c = cluster(DROPPED, [rid("r0", 1)])
    want = overload_desired.desired(TARGET, c.world().observed, enabled=False)
    assert want.target == TARGET and want.groups == ()
    t = transition.plan(c.world(), want.target)
    assert "UnloadBlock" in kinds(t) and "LoadBlock" in kinds(t), kinds(t)


def test_enabled_the_dropped_layout_is_desired() -> None:
    c = cluster(DROPPED, [rid("r0", 1)])  # the loop already removed r1 from the routes
    want = overload_desired.desired(TARGET, c.world().observed, enabled=True)
    (g,) = want.groups
    assert (g.head, g.donors, g.complete) == (rid("r0", 1), (rid("r1", 1),), True)
    assert want.members == {rid("r0", 1), rid("r1", 1)}
    assert [r.id for r in want.target.replicas] == [rid("r0", 1)]
    assert sorted(p.block.key for p in want.target.blocks) == [
        (rid("r0", 1), 0, 0),
        (rid("r0", 1), 1, 0),
    ]
    t = transition.plan(c.world(), want.target)
    assert t.converged and t.steps == ()


def test_enabled_routes_still_naming_the_donor_only_cut_over() -> None:
    """A pass between the drop and its routes step (or a gateway that restarted) routes
    the group as the loop does, and touches no block."""
    c = cluster(DROPPED, [rid("r0", 1)])
    c.published = TARGET_ROUTES  # both replicas, as before the drop
    want = overload_desired.desired(TARGET, c.world().observed, enabled=True)
    t = transition.plan(c.world(), want.target)
    assert kinds(t) == ["CutOver", "Drain"], kinds(t)  # the donor leaves; no block moves
    (cut,) = [s.action for s in t.steps if isinstance(s.action, actions.CutOver)]
    assert cut.replicas == (routes_doc.RouteReplica(rid("r0", 1), "a:1"),)


def test_mid_restore_the_donor_stage_is_kept() -> None:
    """The head is whole again, the donor not yet: its stage is not unloaded under it."""
    mid = [placed("a", block("r0", 1, 0, 1, (0, 8), 8 * L)), DROPPED[1]]
    c = cluster(mid, [rid("r0", 1)])
    want = overload_desired.desired(TARGET, c.world().observed, enabled=True)
    (g,) = want.groups
    assert not g.complete and g.donors == (rid("r1", 1),)
    t = transition.plan(c.world(), want.target)
    assert "UnloadBlock" not in kinds(t) and "LoadBlock" not in kinds(t), kinds(t)


def test_after_restore_the_plan_is_the_target_again() -> None:
    c = cluster(TWO_WHOLE, [rid("r0", 1), rid("r1", 1)])
    want = overload_desired.desired(TARGET, c.world().observed, enabled=True)
    assert want.target == TARGET and want.groups == ()
    assert transition.plan(c.world(), want.target).converged


def test_a_planned_pipeline_is_not_an_overload_group() -> None:
    """Replicas the plan itself pipelines are the plan's, never a drop."""
    pipe = [replace(p, block=replace(p.block, replica_id=rid("r2", 1))) for p in DROPPED]
    target = sim.target_of(pipe, 1)
    c = cluster(pipe, [rid("r2", 1)])
    want = overload_desired.desired(target, c.world().observed, enabled=True)
    assert want.groups == () and want.target == target
    assert routes_doc.RouteReplica(rid("r2", 1), "a:1") in want.target.replicas


def test_generation_view_shows_a_drop_as_the_whole_replicas_it_was() -> None:
    """make_plan's generation assignment must not see a drop as a new layout (found by
    the KMock test: without it the operator loaded a fresh generation over the drop)."""
    c = cluster(DROPPED, [rid("r0", 1)])
    whole = {"r0": ("a", "cpu:0", 8), "r1": ("b", "cpu:0", 8)}
    view = overload_desired.generation_view("default.demo", whole, c.world().observed)
    shown = sorted(
        (a.name, b.replica_id, b.stage_index, b.num_stages, b.start, b.end)
        for a in view.agents
        for b in a.blocks
    )
    assert shown == [("a", rid("r0", 1), 0, 1, 0, 8), ("b", rid("r1", 1), 0, 1, 0, 8)]
    layouts = [("r0", [("a", "cpu:0", 0, 8)]), ("r1", [("b", "cpu:0", 0, 8)])]
    gens = generation.assign("default.demo", layouts, view, (sim.MODEL, dtypes.AUTO), 1)
    assert dict(gens.per_replica) == {"r0": 1, "r1": 1} and gens.plan == 1
    raw = generation.assign(
        "default.demo", layouts, c.world().observed, (sim.MODEL, dtypes.AUTO), 1
    )
    assert raw.plan == 2  # what the drop looked like without the view: a new layout
