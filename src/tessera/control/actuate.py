"""Executor: applies a transition's steps (`tessera.policies.transition.planner`) to the world.

Inputs: a `Transition`, the observed `World`, the shell's `publish` for a `CutOver` (the
operator's routes ConfigMap, `tessera up`'s routes file). Block actions are one agent RPC
each (`LoadBlock`, `UnloadBlock`, a rewire as a `LoadBlock`); a `ResizeKV` is a few
`OverloadShift` ops; a `DropLayers` is KunServe's drop, run by `overload_driver`; a
`Drain` checks the observation, never sleeps. Steps run in plan order and a step behind a
failed or waiting one is skipped: one pass does what can be done now, the next re-plans
from what it observes. Returns one `Result` per step, for events and conditions.
Called by the operator's converge pass, its finalizer and `tessera up`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tessera.control import overload_driver
from tessera.observability import control
from tessera.policies.overload import drop_plan
from tessera.policies.overload import steps as overload_steps
from tessera.policies.transition import actions
from tessera.policies.transition import planner as transition
from tessera.rpc import blocks as rpc_blocks
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class Result:
    action: actions.Action
    ok: bool
    code: str = "OK"  # gRPC status name on failure; "WAITING" for a drain not done
    message: str = ""
    step: int = -1  # the step's id in its transition; -1 outside one

    @property
    def waiting(self) -> bool:
        return self.code == "WAITING"


Progress = Callable[[Result], None]
Publish = Callable[[actions.CutOver], Awaitable[None]]


async def _block(action: actions.BlockAction, timeout: float) -> Result:
    channel = transport.channel(action.address)
    stub = pb_grpc.AgentStub(channel)
    try:
        if isinstance(action, actions.UnloadBlock):
            await stub.UnloadBlock(
                pb.UnloadBlockRequest(
                    replica_id=action.block.replica_id,
                    stage_index=action.block.stage_index,
                    tp_rank=action.block.tp_rank,
                ),
                timeout=timeout,
            )
            return Result(action, True)
        source = action.source if isinstance(action, actions.LoadBlock) else None
        dp = action.data_plane if isinstance(action, actions.LoadBlock) else None
        parts = action.parts if isinstance(action, actions.LoadBlock) else ()
        req = rpc_blocks.load_request(action.block, source, data_plane=dp, parts=parts)
        reply = await stub.LoadBlock(req, timeout=timeout)
        note = ""
        if isinstance(action, actions.LoadBlock):
            note = "already loaded" if reply.already_loaded else ""
            if source is not None:
                note = f"copied from {source.agent}" + (f", {note}" if note else "")
            if parts:
                note = action.describe().partition(" (")[2].rstrip(")") + (
                    f", {note}" if note else ""
                )
        return Result(action, True, message=note)
    except grpc.aio.AioRpcError as exc:
        if isinstance(action, actions.UnloadBlock) and exc.code() == grpc.StatusCode.NOT_FOUND:
            return Result(action, True, message="already gone")
        return Result(action, False, exc.code().name, exc.details() or "")
    finally:
        await channel.close()


async def _resize(action: actions.ResizeKV, timeout: float) -> Result:
    """Pause the leader, resize its allocator and pool (a shrink reports the page moves),
    resize every other stage with those moves, unpause (issue 34)."""
    stages = sorted(action.stages, key=lambda s: s.block.stage_index)
    channels = {s.address: transport.channel(s.address) for s in stages}
    stubs = {a: pb_grpc.AgentStub(c) for a, c in channels.items()}

    def op(s: actions.KVStage, name: str, **kw: Any) -> Any:
        req = pb.OverloadShiftRequest(
            replica_id=s.block.replica_id, stage_index=s.block.stage_index, op=name, **kw
        )
        return stubs[s.address].OverloadShift(req, timeout=timeout)

    lead = stages[0]
    try:
        paused = await op(lead, "pause")
        pages = action.num_pages
        if not pages:  # a grow to the stages' budgets: pages from the leader's page size
            per_layer = (
                paused.kv_bytes
                / max(1, paused.kv_pages)
                / max(1, paused.layer_end - paused.layer_start)
            )
            pages = min(
                int(s.block.kv_bytes / per_layer / (s.block.end - s.block.start)) for s in stages
            )
        try:
            got = await op(lead, "resize", num_pages=pages)
            for s in stages[1:]:
                await op(
                    s, "resize", num_pages=pages, moves_from=got.moves_from, moves_to=got.moves_to
                )
        finally:
            await op(lead, "unpause")
        return Result(action, True, message=f"{pages} pages")
    except grpc.aio.AioRpcError as exc:
        return Result(action, False, exc.code().name, exc.details() or "")
    finally:
        for c in channels.values():
            await c.close()


async def _drop(action: actions.DropLayers, timeout: float) -> Result:
    """Drive KunServe's drop steps for the group the action names (issue 34). The routes
    step is a no-op here: the transition's own `CutOver` took the donors out first."""
    group = drop_plan.Group(
        tuple(s.replica_id for s in action.stages),
        tuple(drop_plan.Stage(s.replica_id, s.start, s.end) for s in action.stages),
        0,
        True,
    )
    members = {s.replica_id: overload_steps.Member(s.replica_id, s.address) for s in action.stages}
    driver = overload_driver.Driver(timeout_s=timeout)
    try:
        rep = await driver.run(overload_steps.drop_steps(group, members))
    except overload_driver.DriveError as exc:
        return Result(action, False, "DROP_FAILED", str(exc))
    finally:
        await driver.close()
    return Result(
        action,
        True,
        message=f"paused {rep.paused_s * 1e3:.0f} ms, {rep.exchanged_pages} pages exchanged",
    )


async def apply(
    block_actions: Sequence[actions.BlockAction],
    progress: Progress | None = None,
    timeout: float = 300.0,
) -> list[Result]:
    """Apply block actions in order, each regardless of the others (the finalizer)."""
    results = []
    for action in block_actions:
        result = await _block(action, timeout)
        results.append(result)
        if progress is not None:
            progress(result)
    return results


async def execute(
    t: transition.Transition,
    world: transition.World,
    publish: Publish,
    progress: Progress | None = None,
    timeout: float = 300.0,
) -> list[Result]:
    """Apply the steps of `t` that can be done now (see the module docstring)."""
    results: list[Result] = []
    stuck: set[int] = set()  # failed, waiting, or behind one of those
    for step in t.steps:
        if stuck.intersection(step.after):
            stuck.add(step.id)
            continue
        a = step.action
        began = time.monotonic()
        if isinstance(a, actions.Drain):
            if transition.drained(world, a.replica_id):
                result = Result(a, True, message="idle", step=step.id)
            else:
                result = Result(a, False, "WAITING", "requests in flight", step=step.id)
        elif isinstance(a, actions.CutOver):
            try:
                await publish(a)
                result = Result(a, True, step=step.id)
            except Exception as exc:  # a failed write of the routes: retried next pass
                result = Result(a, False, "PUBLISH_FAILED", str(exc), step=step.id)
        elif isinstance(a, actions.ResizeKV):
            done = await _resize(a, timeout)
            result = Result(a, done.ok, done.code, done.message, step.id)
        elif isinstance(a, actions.DropLayers):
            done = await _drop(a, timeout)
            result = Result(a, done.ok, done.code, done.message, step.id)
        elif isinstance(a, actions.MoveKV):
            # requests are the gateway's: it moves the KV of its in-flight requests
            result = Result(
                a, False, "UNIMPLEMENTED", "KV moves are applied by the gateway", step=step.id
            )
        else:
            done = await _block(a, timeout)
            result = Result(done.action, done.ok, done.code, done.message, step.id)
        results.append(result)
        control.current().step("transition", type(a).__name__, began, result.ok, a.describe())
        if progress is not None:
            progress(result)
        if not result.ok:
            stuck.add(step.id)
    return results
