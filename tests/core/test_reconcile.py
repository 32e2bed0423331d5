"""The reconcile core as pure data: planned actions for converge, drift, updates, delete."""

from __future__ import annotations

from typing import Any

import pytest

from tessera import api, observed, plan, reconcile
from tessera.cost import model_shape

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
    blocks: dict[str, tuple[observed.BlockInfo, ...]] | None = None, down: tuple[str, ...] = ()
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


def _apply(actions: list[reconcile.Action], obs: observed.Observed) -> observed.Observed:
    """What the agents would report after the actions (a fake cluster)."""
    blocks = {a.name: list(a.blocks) for a in obs.agents}
    for act in actions:
        if isinstance(act, reconcile.UnloadBlock):
            blocks[act.agent] = [
                b
                for b in blocks[act.agent]
                if (b.replica_id, b.stage_index) != (act.replica_id, act.stage_index)
            ]
        else:
            blocks[act.agent].append(
                observed.BlockInfo(
                    act.replica_id,
                    act.stage_index,
                    act.num_stages,
                    act.model_path,
                    act.start,
                    act.end,
                    act.device,
                    act.dtype,
                    act.next_address,
                    1,
                    act.kv_bytes,
                )
            )
    return _agents({k: tuple(v) for k, v in blocks.items()})


def test_converges_and_second_pass_is_empty() -> None:
    dep = _dep(EXPLICIT)
    obs = _agents()
    p = plan.make_plan(dep, SHAPE, obs, "/m")
    actions = reconcile.reconcile(p, obs, plan.owner_prefix(dep))
    described = [a.describe() for a in actions]
    assert described == [
        "load default.demo.a stage 0 layers [0, 8) on n0/cpu:0",
        "load default.demo.b stage 1 layers [4, 8) on n1/cpu:0",
        "load default.demo.b stage 0 layers [0, 4) on n0/cpu:0",
    ]
    leader = actions[2]
    assert isinstance(leader, reconcile.LoadBlock) and leader.next_address == "10.0.0.1:50051"
    after = _apply(actions, obs)
    assert (
        reconcile.reconcile(plan.make_plan(dep, SHAPE, after, "/m"), after, plan.owner_prefix(dep))
        == []
    )


def test_drift_reloads_only_the_lost_block() -> None:
    dep = _dep(EXPLICIT)
    obs = _agents()
    full = _apply(
        reconcile.reconcile(plan.make_plan(dep, SHAPE, obs, "/m"), obs, plan.owner_prefix(dep)), obs
    )
    lost = _agents({"n0": full.agents[0].blocks, "n1": ()})  # n1 restarted, empty
    actions = reconcile.reconcile(
        plan.make_plan(dep, SHAPE, lost, "/m"), lost, plan.owner_prefix(dep)
    )
    assert [a.describe() for a in actions] == [
        "load default.demo.b stage 1 layers [4, 8) on n1/cpu:0"
    ]


def test_update_unloads_old_then_loads_new() -> None:
    dep = _dep(EXPLICIT)
    obs = _agents()
    full = _apply(
        reconcile.reconcile(plan.make_plan(dep, SHAPE, obs, "/m"), obs, plan.owner_prefix(dep)), obs
    )
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
    actions = reconcile.reconcile(
        plan.make_plan(changed, SHAPE, full, "/m"), full, plan.owner_prefix(changed)
    )
    kinds = [type(a).__name__ for a in actions]
    assert kinds == ["UnloadBlock", "UnloadBlock", "LoadBlock", "LoadBlock"]
    assert all("default.demo.a" not in a.replica_id for a in actions)


def test_other_deployments_and_down_agents_are_left_alone() -> None:
    other = observed.BlockInfo("default.other.r0", 0, 1, "/x", 0, 8, "cpu:0", param_bytes=GiB)
    dep = _dep(EXPLICIT)
    obs = _agents({"n0": (other,)}, down=("n1",))
    p = plan.make_plan(dep, SHAPE, obs, "/m")
    actions = reconcile.reconcile(p, obs, plan.owner_prefix(dep))
    assert all(a.agent == "n0" for a in actions)
    assert not any(isinstance(a, reconcile.UnloadBlock) for a in actions)
    # KV budgets are split from what others leave free on the device
    assert p.kv_bytes[("default.demo.a", 0)] < GiB


def test_delete_unloads_everything_of_the_deployment_only() -> None:
    mine = observed.BlockInfo("default.demo.a", 0, 1, "/m", 0, 8, "cpu:0")
    other = observed.BlockInfo("default.demo2.a", 0, 1, "/m", 0, 8, "cpu:0")
    obs = _agents({"n0": (mine, other)})
    actions = reconcile.delete_actions(obs, plan.owner_prefix(_dep(EXPLICIT)))
    assert [(a.agent, a.replica_id) for a in actions] == [("n0", "default.demo.a")]


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
