"""The agent's tensor and link-probe RPCs (weights between agents), mixed into the servicer.

Thin: `PushTensors` sends a held stage's tensors over a data-plane group (`block_copy`),
`FetchTensors` streams them in chunks (`tensor_transfer`); `ProbeLinks` and `ProbeSend`
measure links for the sourcing policy (`link_probe`, issue 32). `EngineError`s map to
gRPC statuses through `grpc_status`. The servicer builds `self.hosting` and `self.defaults`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import grpc

from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import grpc_status, hosting, link_probe, load_config, tensor_transfer
from tessera_agent.engine import errors
from tessera_agent.transfer import block_copy, group

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


class TensorRPCs:
    hosting: hosting.Hosting
    defaults: load_config.LoadDefaults

    @grpc_status.unary
    async def PushTensors(
        self, request: pb.PushTensorsRequest, context: Ctx
    ) -> pb.PushTensorsReply:
        st = self.hosting.get(request.replica_id, request.stage_index).stage
        tensors = tensor_transfer.held(st, list(request.names))
        dp = request.data_plane
        if not dp.store_address or not dp.group:
            raise errors.InvalidArgumentError("data_plane: store_address and group needed")
        try:
            spec = group.GroupSpec(
                dp.store_address,
                dp.group,
                0,
                2,
                dp.backend or "gloo",
                dp.timeout_s or group.DEFAULT_TIMEOUT_S,
            )
        except ValueError as exc:
            raise errors.InvalidArgumentError(f"data_plane: {exc}") from exc
        try:
            sent = await asyncio.get_running_loop().run_in_executor(
                self.hosting.loader, block_copy.push, tensors, spec
            )
        except group.GroupError as exc:  # a group that cannot form or breaks
            raise errors.UnavailableError(str(exc)) from exc
        return pb.PushTensorsReply(bytes=sent)

    @grpc_status.streaming
    async def FetchTensors(
        self, request: pb.FetchTensorsRequest, context: Ctx
    ) -> AsyncIterator[pb.TensorChunk]:
        st = self.hosting.get(request.replica_id, request.stage_index).stage
        tensors = tensor_transfer.held(st, list(request.names))
        for chunk in tensor_transfer.chunks(tensors, request.chunk_bytes):
            yield chunk

    async def ProbeLinks(self, request: pb.ProbeLinksRequest, context: Ctx) -> pb.ProbeLinksReply:
        return await link_probe.probe(request, self.defaults.storage_bytes_per_s, self.defaults.tls)

    async def ProbeSend(
        self, request: pb.ProbeSendRequest, context: Ctx
    ) -> AsyncIterator[pb.TensorChunk]:
        for chunk in link_probe.filler(min(request.nbytes, 1 << 30), request.chunk_bytes):
            yield chunk
