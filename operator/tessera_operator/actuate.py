"""Actuator: applies the reconcile core's actions to agents over gRPC.

Thin on purpose: one RPC per action, results reported per action (with the gRPC status
name as the failure code) so that callers can raise events and conditions. A failed
action never stops the others. Called by the operator's handlers and by `tessera up`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from tessera import reconcile
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class Result:
    action: reconcile.Action
    ok: bool
    code: str = "OK"  # gRPC status name on failure
    message: str = ""


Progress = Callable[[Result], None]


async def _one(action: reconcile.Action, timeout: float) -> Result:
    channel = transport.channel(action.address)
    stub = pb_grpc.AgentStub(channel)
    try:
        if isinstance(action, reconcile.LoadBlock):
            reply = await stub.LoadBlock(
                pb.LoadBlockRequest(
                    model_path=action.model_path,
                    layer_start=action.start,
                    layer_end=action.end,
                    device=action.device,
                    replica_id=action.replica_id,
                    stage_index=action.stage_index,
                    num_stages=action.num_stages,
                    next_stage_address=action.next_address,
                    dtype=action.dtype,
                    kv_bytes=action.kv_bytes,
                ),
                timeout=timeout,
            )
            note = "already loaded" if reply.already_loaded else ""
            return Result(action, True, message=note)
        await stub.UnloadBlock(
            pb.UnloadBlockRequest(replica_id=action.replica_id, stage_index=action.stage_index),
            timeout=timeout,
        )
        return Result(action, True)
    except grpc.aio.AioRpcError as exc:
        if isinstance(action, reconcile.UnloadBlock) and exc.code() == grpc.StatusCode.NOT_FOUND:
            return Result(action, True, message="already gone")
        return Result(action, False, exc.code().name, exc.details() or "")
    finally:
        await channel.close()


async def apply(
    actions: Sequence[reconcile.Action], progress: Progress | None = None, timeout: float = 300.0
) -> list[Result]:
    """Apply actions in order (unloads before loads, as the core orders them)."""
    results = []
    for action in actions:
        result = await _one(action, timeout)
        results.append(result)
        if progress is not None:
            progress(result)
    return results
