"""Tensor-parallel stages in the transition planner and in readiness: a stage whose group
failed, or that is only partly held, is reloaded whole; it does not count as complete."""

from __future__ import annotations

import dataclasses

from tessera import blocks, observed
from tessera.policies.transition import actions
from tessera.policies.transition import planner as transition

PREFIX = "default.tp."
RID = PREFIX + "r0.g1"


def _block(rank: int, **kw: object) -> blocks.Block:
    return dataclasses.replace(
        blocks.Block(
            "/m",
            0,
            8,
            RID,
            0,
            "cpu:0",
            generation=1,
            tp_size=2,
            tp_rank=rank,
            kv_bytes=1 << 20,
            param_bytes=1 << 20,
        ),
        **kw,  # type: ignore[arg-type]
    )


def _obs(held: dict[str, list[blocks.Block]]) -> observed.Observed:
    dev = (observed.DeviceInfo("cpu:0", "cpu", 1 << 30, 1 << 29),)
    return observed.Observed(
        tuple(
            observed.AgentInfo(name, f"{name}:1", devices=dev, blocks=tuple(bs))
            for name, bs in held.items()
        )
    )


def _target() -> transition.Target:
    from tessera import routes_doc

    dp = actions.DataPlane("a0:9", RID)
    return transition.Target(
        1,
        (
            transition.Placed("a0", "a0:1", _block(0), dp),
            transition.Placed("a1", "a1:1", _block(1), dp),
        ),
        (routes_doc.RouteReplica(RID, "a0:1"),),
    )


def _loads(t: transition.Transition) -> list[actions.LoadBlock]:
    return [s.action for s in t.steps if isinstance(s.action, actions.LoadBlock)]


def test_loads_carry_the_data_plane() -> None:
    t = transition.plan(transition.World(_obs({"a0": [], "a1": []}), PREFIX), _target())
    loads = _loads(t)
    assert sorted(ld.block.tp_rank for ld in loads) == [0, 1]
    assert all(ld.data_plane == actions.DataPlane("a0:9", RID) for ld in loads)


def test_a_ready_tp_stage_is_left_alone_and_complete() -> None:
    obs = _obs({"a0": [_block(0, group_state="ready")], "a1": [_block(1, group_state="ready")]})
    assert transition.complete_replicas(obs, PREFIX) == {RID}
    t = transition.plan(transition.World(obs, PREFIX), _target())
    assert not _loads(t)


def test_a_failed_group_reloads_every_rank_and_is_not_complete() -> None:
    obs = _obs(
        {
            "a0": [_block(0, group_state="failed", group_reason="rank 1 died")],
            "a1": [_block(1, group_state="ready")],
        }
    )
    assert transition.complete_replicas(obs, PREFIX) == set()
    t = transition.plan(transition.World(obs, PREFIX), _target())
    unloads = {s.id for s in t.steps if isinstance(s.action, actions.UnloadBlock)}
    assert len(unloads) == 2
    loads = [s for s in t.steps if isinstance(s.action, actions.LoadBlock)]
    assert sorted(s.action.block.tp_rank for s in loads) == [0, 1]  # type: ignore[union-attr]
    assert all(unloads <= set(s.after) for s in loads)  # the old group is gone first


def test_a_half_held_stage_is_reloaded_whole() -> None:
    obs = _obs({"a0": [_block(0, group_state="forming")], "a1": []})
    assert transition.complete_replicas(obs, PREFIX) == set()
    t = transition.plan(transition.World(obs, PREFIX), _target())
    assert sorted(ld.block.tp_rank for ld in _loads(t)) == [0, 1]
