"""The agent's `Scaling*` RPCs (module-level scaling, issue 15), mixed into the servicer.

Thin: each method delegates to `scaling_control.ScalingControl` (operations on this
agent's stages) or `scaling_host.RunHost` (runs held for other agents' stages) and maps
`EngineError`s to gRPC statuses. The servicer builds `self.scaling` and `self.run_host`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import grpc

from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import grpc_status, scaling_control, scaling_host

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


class ScalingRPCs:
    scaling: scaling_control.ScalingControl
    run_host: scaling_host.RunHost

    @grpc_status.unary
    async def ScalingReplicate(
        self, request: pb.ScalingOpRequest, context: Ctx
    ) -> pb.ScalingOpReply:
        return await self.scaling.replicate(request)

    @grpc_status.unary
    async def ScalingMigrate(self, request: pb.ScalingOpRequest, context: Ctx) -> pb.ScalingOpReply:
        return await self.scaling.migrate(request)

    @grpc_status.unary
    async def ScalingEvict(self, request: pb.ScalingOpRequest, context: Ctx) -> pb.ScalingOpReply:
        return await self.scaling.evict(request)

    @grpc_status.unary
    async def ScalingRunLoad(
        self, request: pb.ScalingRunLoadRequest, context: Ctx
    ) -> pb.ScalingRunLoadReply:
        return await self.run_host.load(request)

    @grpc_status.unary
    async def ScalingBatchLimit(
        self, request: pb.ScalingBatchLimitRequest, context: Ctx
    ) -> pb.ScalingBatchLimitReply:
        return await self.scaling.batch_limit(request)

    @grpc_status.unary
    async def ScalingRunStep(
        self, request: pb.ScalingRunStepRequest, context: Ctx
    ) -> pb.ScalingRunStepReply:
        return await self.run_host.step(request)

    @grpc_status.streaming
    async def ScalingRunExportKV(
        self, request: pb.ScalingRunKVRequest, context: Ctx
    ) -> AsyncIterator[pb.KVLayer]:
        for layer in self.run_host.export_kv(request):
            yield layer

    @grpc_status.unary
    async def ScalingRunImportKV(
        self, request_iterator: AsyncIterator[pb.ScalingRunKVImport], context: Ctx
    ) -> pb.ImportKVReply:
        return pb.ImportKVReply(layers=await self.run_host.import_kv(request_iterator))

    @grpc_status.unary
    async def ScalingRunUnload(
        self, request: pb.ScalingRunUnloadRequest, context: Ctx
    ) -> pb.ScalingRunUnloadReply:
        await self.run_host.unload(request.run_id)
        return pb.ScalingRunUnloadReply(unloaded=True)
