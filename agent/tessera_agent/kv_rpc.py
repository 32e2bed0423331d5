"""The agent's KV RPCs (pins and page moves between replicas), mixed into the servicer.

Thin: `PinPrefix`, `ReservePages`, `CommitPrefix` and `ReleasePin` delegate to the
replica's leader engine; `ExportKV` and `ImportKV` to `kv_transfer` (over the stream) or
`kv_copy` (over a data-plane group). `EngineError`s map to gRPC statuses through
`grpc_status`. The servicer builds `self.hosting` and sets `self.store_address`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeAlias

import grpc

from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import grpc_status, hosting, kv_transfer
from tessera_agent.engine import errors, kv_pins, replica, stage
from tessera_agent.transfer import group, kv_copy

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


class KVRPCs:
    hosting: hosting.Hosting
    store_address: str

    def _leader(self, replica_id: str) -> replica.ReplicaEngine:
        return self.hosting.leader(replica_id)

    def _stage(self, replica_id: str, stage_index: int) -> stage.Stage:
        return self.hosting.get(replica_id, stage_index).stage

    @staticmethod
    def _pin_reply(pin: kv_pins.Pin) -> pb.PinReply:
        return pb.PinReply(
            pin_id=pin.pin_id,
            page_ids=list(pin.page_ids),
            num_tokens=pin.num_tokens,
            page_size=pin.page_size,
        )

    @grpc_status.unary
    async def PinPrefix(self, request: pb.PinPrefixRequest, context: Ctx) -> pb.PinReply:
        leader = self._leader(request.replica_id)
        return self._pin_reply(await leader.pin_prefix(list(request.token_ids)))

    @grpc_status.unary
    async def ReservePages(self, request: pb.ReservePagesRequest, context: Ctx) -> pb.PinReply:
        leader = self._leader(request.replica_id)
        return self._pin_reply(await leader.reserve_pages(request.num_pages))

    @grpc_status.unary
    async def CommitPrefix(
        self, request: pb.CommitPrefixRequest, context: Ctx
    ) -> pb.CommitPrefixReply:
        leader = self._leader(request.replica_id)
        n = await leader.commit_prefix(request.pin_id, list(request.token_ids))
        return pb.CommitPrefixReply(registered_pages=n)

    @grpc_status.unary
    async def ReleasePin(self, request: pb.ReleasePinRequest, context: Ctx) -> pb.ReleasePinReply:
        self._leader(request.replica_id).release_pin(request.pin_id)
        return pb.ReleasePinReply(released=True)

    @staticmethod
    async def _kv_over_group(
        fn: Callable[[stage.Stage, list[int], int, int, group.GroupSpec], int],
        st: stage.Stage,
        pages: list[int],
        start: int,
        end: int,
        spec: group.GroupSpec,
    ) -> int:
        """Run one end of a KV move over the data plane on a worker thread; a group that
        cannot form or breaks is UNAVAILABLE (the client falls back to the stream)."""
        try:
            return await asyncio.get_running_loop().run_in_executor(
                None, fn, st, pages, start, end, spec
            )
        except group.GroupError as exc:
            raise errors.UnavailableError(str(exc)) from exc

    @grpc_status.streaming
    async def ExportKV(
        self, request: pb.ExportKVRequest, context: Ctx
    ) -> AsyncIterator[pb.KVLayer]:
        st = self._stage(request.replica_id, request.stage_index)
        if request.HasField("data_plane"):  # the layers go over a group, not the stream
            await self._kv_over_group(
                kv_copy.push,
                st,
                list(request.page_ids),
                request.layer_start,
                request.layer_end,
                kv_copy.pair_spec(request.data_plane, kv_copy.EXPORTER),
            )
            return
        layers = kv_transfer.export_layers(
            st, list(request.page_ids), request.layer_start, request.layer_end
        )
        for layer in layers:
            yield layer

    @grpc_status.unary
    async def ImportKV(
        self, request_iterator: AsyncIterator[pb.KVImportMessage], context: Ctx
    ) -> pb.ImportKVReply:
        n = 0
        first = await anext(request_iterator, None)
        if first is None or not first.HasField("header"):
            raise errors.InvalidArgumentError("ImportKV: the first message must be a header")
        head = first.header
        st = self._stage(head.replica_id, head.stage_index)
        pages = kv_transfer.valid_pages(st, head.page_ids)
        if head.HasField("data_plane"):  # the layers come over a group
            n = await self._kv_over_group(
                kv_copy.receive,
                st,
                pages,
                head.layer_start,
                head.layer_end,
                kv_copy.pair_spec(head.data_plane, kv_copy.IMPORTER, self.store_address),
            )
            return pb.ImportKVReply(layers=n)
        async for msg in request_iterator:
            if not msg.HasField("layer"):
                raise errors.InvalidArgumentError("ImportKV: one header, then layers")
            kv_transfer.import_layer(st, pages, msg.layer)
            n += 1
        return pb.ImportKVReply(layers=n)
