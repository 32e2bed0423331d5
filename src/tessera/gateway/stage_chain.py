"""Where a replica's stages live: walks its leader's `next_stage_address` chain.

A KV move (`tessera.control.kv_move.move_prefix`) needs every stage of the source and target
replicas (agent address, stage index, global layers) and the KV page size; the routes
document only names each replica's leader. `resolve` asks the leader's `Describe` for the
replica's stage 0, then each next stage's agent, until the last stage. Replica ids are
opaque and fixed per layout generation (a changed layout gets a new id), so the caller
(`cutover.Cutover`) caches the answer per replica id.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from tessera.control import kv_move
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

DEFAULT_PAGE_SIZE = 16  # the agent's default when a block reports none


@dataclass(frozen=True)
class Layout:
    """A replica's stages in order (stage 0 first) and its KV page size."""

    stages: tuple[kv_move.StageRef, ...]
    page_size: int


class ChainError(Exception):
    """The chain could not be followed; the message says where."""


async def resolve(
    replica_id: str, leader: str, timeout_s: float = 5.0, *, tls: transport.TlsFiles | None
) -> Layout:
    """The stages of `replica_id` whose stage 0 is on the agent at `leader`."""
    stages: list[kv_move.StageRef] = []
    page_size = 0
    address, index = leader, 0
    while address:
        if index > 64:
            raise ChainError(f"replica {replica_id}: the stage chain does not end")
        channel = transport.channel(address, tls)
        try:
            reply = await pb_grpc.AgentStub(channel).Describe(
                pb.DescribeRequest(), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise ChainError(
                f"replica {replica_id} stage {index}: Describe at {address} failed: "
                f"{exc.code().name} {exc.details()}"
            ) from exc
        finally:
            await channel.close()
        block = next(
            (b for b in reply.blocks if b.replica_id == replica_id and b.stage_index == index),
            None,
        )
        if block is None:
            raise ChainError(f"replica {replica_id}: agent at {address} holds no stage {index}")
        stages.append(
            kv_move.StageRef(address, replica_id, index, block.layer_start, block.layer_end)
        )
        page_size = page_size or int(block.page_size) or DEFAULT_PAGE_SIZE
        address, index = block.next_stage_address, index + 1
    return Layout(tuple(stages), page_size)
