"""Move a request's computed KV prefix from one replica to another, over the agents' RPCs.

`move_prefix(tokens, src, dst)`: pins the source leader's prefix-cache pages holding
`tokens`, reserves as many on the target leader, streams each layer's K/V from the source
stage holding it to the target stage holding it (the replicas may split the model
differently), registers the pages in the target's prefix cache and releases both holds,
also on failure. The K/V go agent to agent over a 2-rank group when both serve a
rendezvous store (`tessera_agent.transfer.kv_copy`), else through this client on the
`ExportKV`/`ImportKV` streams; `Moved.transport` says which. Caller: a control loop that
migrates or drains a replica (the gateway's mid-stream continuation then skips the prefix).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import grpc

from tessera.control import agents
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
GRPC = "grpc"
TRANSPORTS = ("auto", GRPC)  # auto: a data-plane group where both agents have one


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
    transport: str = ""  # what carried the K/V: "gloo", "nccl", "grpc" ("+"-joined if several)


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
    via: str = "auto",
    *,
    tls: transport.TlsFiles | None,
) -> Moved:
    """Copy the K/V of `tokens`' cached prefix from replica `src` to replica `dst`
    (stages in order, stage 0 first); `via="grpc"` keeps to the gRPC streams."""
    if not src or not dst:
        raise MoveError("move_prefix: both replicas need at least one stage")
    if via not in TRANSPORTS:
        raise MoveError(f"via {via!r}: expected one of {', '.join(TRANSPORTS)}")
    channels = agents.Channels(tls)  # the control plane's agent client; closed at the end
    stub = channels.stub

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
        layers, used = 0, set()
        for target in dst:
            layer = target.start
            while layer < target.end:
                source = _owner(src, layer)
                run = _Run(source, target, layer, min(target.end, source.end))
                step = f"move layers [{run.start}, {run.end}) to {target.address}"
                moved, how = await _move_run(
                    stub, run, list(pin.page_ids), list(res.page_ids), via, timeout
                )
                layers, layer = layers + moved, run.end
                used.add(how)
        step = "register the pages on the target"
        n = len(pin.page_ids) * pin.page_size
        await dst_leader.CommitPrefix(
            pb.CommitPrefixRequest(
                replica_id=dst[0].replica_id, pin_id=reserved, token_ids=list(tokens[:n])
            ),
            timeout=timeout,
        )
        reserved = ""
        return Moved(pin.num_tokens, len(pin.page_ids), layers, "+".join(sorted(used)))
    except grpc.aio.AioRpcError as exc:
        raise MoveError(f"{step}: {exc.code().name}: {exc.details()}") from exc
    finally:
        # Shielded: a move cancelled mid-way (its cut-over or gateway stopping) still
        # releases both pins before the channels close.
        await asyncio.shield(
            _release(
                [
                    (src_leader, src[0].replica_id, pinned),
                    (dst_leader, dst[0].replica_id, reserved),
                ],
                channels,
            )
        )


async def _release(
    pins: list[tuple[pb_grpc.AgentStub, str, str]], channels: agents.Channels
) -> None:
    """Release every pin (an agent that is gone took its pins with it), then close."""
    for leader, replica_id, pin_id in pins:
        if pin_id:
            try:
                await leader.ReleasePin(
                    pb.ReleasePinRequest(replica_id=replica_id, pin_id=pin_id), timeout=10
                )
            except grpc.aio.AioRpcError:
                pass
    await channels.close()


@dataclass(frozen=True)
class _Run:
    """Global layers [start, end): held by `source`, imported by `target`."""

    source: StageRef
    target: StageRef
    start: int
    end: int


async def _plane(stub: pb_grpc.AgentStub, ref: StageRef, timeout: float) -> tuple[str, str]:
    """(store address, device kind) of the agent holding `ref`; ("", "") without a store."""
    d = await stub.Describe(pb.DescribeRequest(), timeout=timeout)
    device = next(
        (
            b.device
            for b in d.blocks
            if (b.replica_id, b.stage_index) == (ref.replica_id, ref.stage_index)
        ),
        "",
    )
    kind = next((x.kind for x in d.devices if x.id == device), "")
    return d.store_address, kind


async def _move_run(
    stub: Callable[[str], pb_grpc.AgentStub],
    run: _Run,
    src_pages: list[int],
    dst_pages: list[int],
    via: str,
    timeout: float,
) -> tuple[int, str]:
    """Move one run of layers; (layers moved, transport used)."""
    if via != GRPC:
        (store, dst_kind), (src_store, src_kind) = await asyncio.gather(
            _plane(stub(run.target.address), run.target, timeout),
            _plane(stub(run.source.address), run.source, timeout),
        )
        if store and src_store:
            backend = "nccl" if dst_kind == src_kind == "cuda" else "gloo"
            try:
                n = await _over_group(stub, run, src_pages, dst_pages, store, backend, timeout)
                return n, backend
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                log.warning(
                    "KV move over %s failed, falling back to gRPC: %s", backend, exc.details()
                )
    return await _over_stream(stub, run, src_pages, dst_pages, timeout), GRPC


async def _over_group(
    stub: Callable[[str], pb_grpc.AgentStub],
    run: _Run,
    src_pages: list[int],
    dst_pages: list[int],
    store: str,
    backend: str,
    timeout: float,
) -> int:
    """Both agents meet in a fresh 2-rank group on the importer's store."""
    dp = pb.DataPlane(
        store_address=store,
        group=f"kv/{uuid.uuid4().hex}",
        backend=backend,
        timeout_s=min(timeout, 30.0),
    )
    header = pb.KVImportHeader(
        replica_id=run.target.replica_id,
        stage_index=run.target.stage_index,
        page_ids=dst_pages,
        data_plane=dp,
        layer_start=run.start,
        layer_end=run.end,
    )

    async def one_header() -> AsyncIterator[pb.KVImportMessage]:
        yield pb.KVImportMessage(header=header)

    importing = asyncio.ensure_future(
        stub(run.target.address).ImportKV(one_header(), timeout=timeout)
    )
    export = stub(run.source.address).ExportKV(_export(run, src_pages, dp), timeout=timeout)
    try:
        async for _ in export:  # nothing comes on the stream; it ends when all is sent
            pass
        reply = await importing
    finally:
        importing.cancel()  # a failed export leaves no importer waiting for the group
        export.cancel()
    return int(reply.layers)


def _export(run: _Run, src_pages: list[int], dp: pb.DataPlane | None = None) -> pb.ExportKVRequest:
    """The exporter's request for `run`'s layers of `src_pages` (over `dp` where given)."""
    return pb.ExportKVRequest(
        replica_id=run.source.replica_id,
        stage_index=run.source.stage_index,
        page_ids=src_pages,
        layer_start=run.start,
        layer_end=run.end,
        data_plane=dp,
    )


async def _over_stream(
    stub: Callable[[str], pb_grpc.AgentStub],
    run: _Run,
    src_pages: list[int],
    dst_pages: list[int],
    timeout: float,
) -> int:
    """The fallback: the layers relayed through this client on the gRPC streams."""

    async def messages() -> AsyncIterator[pb.KVImportMessage]:
        header = pb.KVImportHeader(
            replica_id=run.target.replica_id,
            stage_index=run.target.stage_index,
            page_ids=dst_pages,
        )
        yield pb.KVImportMessage(header=header)
        export = stub(run.source.address).ExportKV(_export(run, src_pages), timeout=timeout)
        async for kv in export:
            yield pb.KVImportMessage(layer=kv)

    reply = await stub(run.target.address).ImportKV(messages(), timeout=timeout)
    return int(reply.layers)
