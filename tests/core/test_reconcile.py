"""The reconcile core as pure data: planned actions for converge, drift, updates, delete."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tessera import api, observed, plan, reconcile, routes_doc
from tessera import blocks as tessera_blocks
from tessera.cost import model_shape
from tessera.policies.transition import actions
from tessera.policies.transition import planner as transition

SHAPE = model_shape.ModelShape(
    name="tiny",
    hidden_size=256,
    intermediate_size=704,
    num_layers=8,
    num_heads=4,
    num_kv_heads=2,
    vocab_size=512,
    head_dim=64,
    dtype_bytes=4,
)
GiB = 1 << 30


def _dep(layout: dict[str, Any], name: str = "demo") -> api.ServingDeployment:
    return api.parse(
        {
            "apiVersion": "serving.tessera.dev/v1alpha1",
            "kind": "ServingDeployment",
            "metadata": {"name": name},
            "spec": {"model": {"name": "m", "path": "/m"}, "layout": layout},
        }
    )


EXPLICIT = {
    "mode": "explicit",
    "replicas": [
        {"name": "a", "stages": [{"agent": "n0", "layers": [0, 8]}]},
        {
            "name": "b",
            "stages": [{"agent": "n0", "layers": [0, 4]}, {"agent": "n1", "layers": [4, 8]}],
        },
    ],
}


def _agents(
    blocks: dict[str, tuple[tessera_blocks.Block, ...]] | None = None, down: tuple[str, ...] = ()
) -> observed.Observed:
    blocks = blocks or {}
    return observed.Observed(
        tuple(
            observed.AgentInfo(
                n,
                f"10.0.0.{i}:50051",
                reachable=n not in down,
                devices=(observed.DeviceInfo("cpu:0", "cpu", 2 * GiB, 2 * GiB),),
                blocks=blocks.get(n, ()),
            )
            for i, n in enumerate(("n0", "n1"))
        )
    )


State = tuple[observed.Observed, routes_doc.RoutesDoc | None]


def _pass(dep: api.ServingDeployment, state: State) -> tuple[plan.Plan, transition.Transition]:
    obs, routes = state
    p = plan.make_plan(dep, SHAPE, obs, "/m", floor=routes.version if routes else 0)
    world = transition.World(obs, plan.owner_prefix(dep), routes, now=1e9)
    return p, transition.plan(world, reconcile.target(p, obs))


def _apply(steps: tuple[actions.Step, ...], state: State) -> State:
    """What the agents and the gateway would report after the steps (a fake cluster;
    drains hold: nothing runs)."""
    obs, routes = state
    blocks = {a.name: list(a.blocks) for a in obs.agents}
    for s in steps:
        act = s.action
        if isinstance(act, actions.UnloadBlock):
            blocks[act.agent] = [b for b in blocks[act.agent] if b.key != act.block.key]
        elif isinstance(act, actions.LoadBlock):
            blocks[act.agent].append(act.block)
        elif isinstance(act, actions.CutOver):
            routes = routes_doc.RoutesDoc(act.replicas, act.version, cut_over_at=0.0)
    return observed.Observed(
        tuple(dataclasses.replace(a, blocks=tuple(blocks[a.name])) for a in obs.agents)
    ), routes


def test_converges_and_second_pass_is_empty() -> None:
    dep = _dep(EXPLICIT)
    state: State = (_agents(), None)
    p, t = _pass(dep, state)
    assert p.generation == 1
    assert [r.replica_id for r in p.replicas] == ["default.demo.a.g1", "default.demo.b.g1"]
    assert [s.action.describe() for s in t.steps] == [
        "load default.demo.a.g1 stage 0 layers [0, 8) on cpu:0 on n0",
        "load default.demo.b.g1 stage 1 layers [4, 8) on cpu:0 on n1",
        "load default.demo.b.g1 stage 0 layers [0, 4) on cpu:0 on n0",
        "cut routes over to version 1: default.demo.a.g1, default.demo.b.g1",
    ]
    leader = t.steps[2].action
    assert isinstance(leader, actions.LoadBlock)
    assert leader.block.next_address == "10.0.0.1:50051" and leader.block.generation == 1
    assert leader.block.param_bytes == plan.stage_param_bytes(SHAPE, 0, 4)
    after = _apply(t.steps, state)
    assert _pass(dep, after)[1].converged


def test_drift_reloads_only_the_lost_block() -> None:
    dep = _dep(EXPLICIT)
    obs, routes = _apply(_pass(dep, (_agents(), None))[1].steps, (_agents(), None))
    lost = _agents({"n0": obs.agents[0].blocks, "n1": ()})  # n1 restarted, empty
    p, t = _pass(dep, (lost, routes))
    assert p.generation == 1  # same replicas, same ids: no cut-over
    # n0's whole replica holds layers [4, 8) and the head: the default link beats storage
    assert [s.action.describe() for s in t.steps] == [
        "load default.demo.b.g1 stage 1 layers [4, 8) on cpu:0 on n1 (copy from n0)"
    ]


def test_update_makes_before_breaking_with_a_new_generation() -> None:
    dep = _dep(EXPLICIT)
    state = _apply(_pass(dep, (_agents(), None))[1].steps, (_agents(), None))
    changed = _dep(
        {
            "mode": "explicit",
            "replicas": [
                {"name": "a", "stages": [{"agent": "n0", "layers": [0, 8]}]},
                {
                    "name": "b",
                    "stages": [
                        {"agent": "n0", "layers": [0, 2]},
                        {"agent": "n1", "layers": [2, 8]},
                    ],
                },
            ],
        }
    )
    p, t = _pass(changed, state)
    assert p.generation == 2
    assert [r.replica_id for r in p.replicas] == ["default.demo.a.g1", "default.demo.b.g2"]
    kinds = [s.action.kind for s in t.steps]
    assert kinds == ["LoadBlock", "LoadBlock", "CutOver", "Drain", "UnloadBlock", "UnloadBlock"]
    assert all(
        "default.demo.a" not in s.action.describe() for s in t.steps if s.action.kind != "CutOver"
    )
    # interrupted after the first load: the same generation resumes
    half = _apply(t.steps[:1], state)
    p2, t2 = _pass(changed, half)
    assert p2.generation == 2 and [s.action.kind for s in t2.steps][:2] == ["LoadBlock", "CutOver"]
    assert _pass(changed, _apply(t.steps, state))[1].converged


def test_other_deployments_and_down_agents_are_left_alone() -> None:
    other = tessera_blocks.Block("/x", 0, 8, replica_id="default.other.r0.g1", param_bytes=GiB)
    dep = _dep(EXPLICIT)
    obs = _agents({"n0": (other,)}, down=("n1",))
    p, t = _pass(dep, (obs, None))
    assert t.blocked is not None and t.blocked.reason == "AgentUnreachable"
    assert not any(isinstance(s.action, actions.UnloadBlock) for s in t.steps)
    # KV budgets are split from what others leave free on the device
    assert p.kv_bytes[("default.demo.a.g1", 0)] < GiB


def test_delete_unloads_everything_of_the_deployment_only() -> None:
    mine = tessera_blocks.Block("/m", 0, 8, replica_id="default.demo.a.g1")
    other = tessera_blocks.Block("/m", 0, 8, replica_id="default.demo2.a.g1")
    obs = _agents({"n0": (mine, other)})
    acts = reconcile.delete_actions(obs, plan.owner_prefix(_dep(EXPLICIT)))
    assert [(a.agent, a.block.replica_id) for a in acts] == [("n0", "default.demo.a.g1")]


def test_auto_simple_plan_and_insufficient_capacity() -> None:
    dep = _dep({"mode": "auto"})
    p = plan.make_plan(dep, SHAPE, _agents(), "/m")
    assert p.source == "auto:simple" and len(p.replicas) == 2
    tiny = observed.Observed(
        tuple(
            observed.AgentInfo(
                f"n{i}", f"h:{i}", devices=(observed.DeviceInfo("cpu:0", "cpu", 8 << 20, 8 << 20),)
            )
            for i in range(2)
        )
    )
    with pytest.raises(plan.PlanError) as info:
        plan.make_plan(dep, SHAPE, tiny, "/m")
    assert info.value.reason == "InsufficientCapacity"
    roomy = observed.Observed(
        tuple(
            observed.AgentInfo(
                f"n{i}",
                f"h:{i}",
                devices=(observed.DeviceInfo("cpu:0", "cpu", 24 << 20, 24 << 20),),
            )
            for i in range(2)
        )
    )
    piped = plan.make_plan(dep, SHAPE, roomy, "/m")
    (only,) = piped.replicas
    assert len(only.stages) == 2 and only.stages[0].end == only.stages[1].start


def test_a_new_auto_plan_is_a_transition_too() -> None:
    """`layout: auto` on two agents, then a third joins: the new replica gets the next
    generation, the others keep theirs, and the routes cut over to the larger set."""
    dep = _dep({"mode": "auto"})
    state = _apply(_pass(dep, (_agents(), None))[1].steps, (_agents(), None))
    obs, routes = state
    third = observed.AgentInfo(
        "n2", "10.0.0.2:50051", devices=(observed.DeviceInfo("cpu:0", "cpu", 2 * GiB, 2 * GiB),)
    )
    grown = observed.Observed((*obs.agents, third))
    p, t = _pass(dep, (grown, routes))
    assert [r.replica_id for r in p.replicas] == [
        "default.demo.r0.g1",
        "default.demo.r1.g1",
        "default.demo.r2.g2",
    ]
    assert [s.action.kind for s in t.steps] == ["LoadBlock", "CutOver"]
    load = t.steps[0].action
    assert isinstance(load, actions.LoadBlock) and load.source is not None  # a peer has it
    assert _pass(dep, _apply(t.steps, (grown, routes)))[1].converged
