"""Move a request's computed KV prefix from one replica to another, over the agents' RPCs.

`move_prefix(tokens, src, dst)` — the client side of the agent's KV-movement RPCs, for a
control loop that migrates or drains a replica. It pins the prefix-cache pages that hold
`tokens` on the source leader, reserves as many pages on the target leader, streams each
global layer's K/V from the source stage that holds it to the target stage that holds it
(the two replicas may split the model differently), registers the pages in the target's
prefix cache under the tokens, and releases both holds, also on failure. A request then
continued on the target with `tokens` as its prompt (the gateway's mid-stream continuation
does exactly that) starts after the moved prefix instead of recomputing it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc

from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class StageRef:
    """One stage of a replica: the agent that holds it and its global layers [start, end)."""

    address: str
    replica_id: str
    stage_index: int
    start: int
    end: int


@dataclass(frozen=True)
class Moved:
    tokens: int  # tokens whose K/V now sit in the target's prefix cache (0: none cached)
    pages: int
    layers: int


class MoveError(Exception):
    """A step of the move failed; the message names the step and the agent's status."""


def _owner(stages: Sequence[StageRef], layer: int) -> StageRef:
    for s in stages:
        if s.start <= layer < s.end:
            return s
    raise MoveError(f"no stage of replica {stages[0].replica_id} holds layer {layer}")


async def move_prefix(
    tokens: Sequence[int],
    src: Sequence[StageRef],
    dst: Sequence[StageRef],
    timeout: float = 120.0,
) -> Moved:
    """Copy the K/V of `tokens`' cached prefix from replica `src` to replica `dst`
    (stages in order, stage 0 first)."""
    if not src or not dst:
        raise MoveError("move_prefix: both replicas need at least one stage")
    channels: dict[str, grpc.aio.Channel] = {}

    def stub(address: str) -> pb_grpc.AgentStub:
        if address not in channels:
            channels[address] = transport.channel(address)
        return pb_grpc.AgentStub(channels[address])

    src_leader, dst_leader = stub(src[0].address), stub(dst[0].address)
    pinned = reserved = ""
    try:
        step = "pin the prefix on the source"
        pin = await src_leader.PinPrefix(
            pb.PinPrefixRequest(replica_id=src[0].replica_id, token_ids=list(tokens)),
            timeout=timeout,
        )
        pinned = pin.pin_id
        if not pin.page_ids:
            return Moved(0, 0, 0)
        step = "reserve pages on the target"
        res = await dst_leader.ReservePages(
            pb.ReservePagesRequest(replica_id=dst[0].replica_id, num_pages=len(pin.page_ids)),
            timeout=timeout,
        )
        reserved = res.pin_id
        if res.page_size != pin.page_size:
            raise MoveError(
                f"page sizes differ: {pin.page_size} on the source, {res.page_size} on the target"
            )
        layers = 0
        for target in dst:
            step = f"move layers [{target.start}, {target.end}) to {target.address}"

            async def messages(target: StageRef = target) -> AsyncIterator[pb.KVImportMessage]:
                header = pb.KVImportHeader(
                    replica_id=target.replica_id,
                    stage_index=target.stage_index,
                    page_ids=list(res.page_ids),
                )
                yield pb.KVImportMessage(header=header)
                layer = target.start
                while layer < target.end:
                    source = _owner(src, layer)
                    end = min(target.end, source.end)
                    export = stub(source.address).ExportKV(
                        pb.ExportKVRequest(
                            replica_id=source.replica_id,
                            stage_index=source.stage_index,
                            page_ids=list(pin.page_ids),
                            layer_start=layer,
                            layer_end=end,
                        ),
                        timeout=timeout,
                    )
                    async for kv in export:
                        yield pb.KVImportMessage(layer=kv)
                    layer = end

            reply = await stub(target.address).ImportKV(messages(), timeout=timeout)
            layers += reply.layers
        step = "register the pages on the target"
        n = len(pin.page_ids) * pin.page_size
        await dst_leader.CommitPrefix(
            pb.CommitPrefixRequest(
                replica_id=dst[0].replica_id, pin_id=reserved, token_ids=list(tokens[:n])
            ),
            timeout=timeout,
        )
        reserved = ""
        return Moved(pin.num_tokens, len(pin.page_ids), layers)
    except grpc.aio.AioRpcError as exc:
        raise MoveError(f"{step}: {exc.code().name}: {exc.details()}") from exc
    finally:
        for leader, replica_id, pin_id in (
            (src_leader, src[0].replica_id, pinned),
            (dst_leader, dst[0].replica_id, reserved),
        ):
            if pin_id:
                try:
                    await leader.ReleasePin(
                        pb.ReleasePinRequest(replica_id=replica_id, pin_id=pin_id), timeout=10
                    )
                except grpc.aio.AioRpcError:
                    pass  # the agent is gone, and its pins with it
        for channel in channels.values():
            await channel.close()
