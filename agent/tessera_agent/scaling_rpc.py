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
from tessera_agent.engine import errors

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


class ScalingRPCs:
    scaling: scaling_control.ScalingControl
    run_host: scaling_host.RunHost

    async def ScalingReplicate(
        self, request: pb.ScalingOpRequest, context: Ctx
    ) -> pb.ScalingOpReply:
        try:
            return await self.scaling.replicate(request)
        except errors.EngineError as exc:
            await grpc_status.abort(context, exc)

    async def ScalingMigrate(self, request: pb.ScalingOpRequest, context: Ctx) -> pb.ScalingOpReply:
        try:
            return await self.scaling.migrate(request)
        except errors.EngineError as exc:
            await grpc_status.abort(context, exc)

    async def ScalingEvict(self, request: pb.ScalingOpRequest, context: Ctx) -> pb.ScalingOpReply:
        try:
            return await self.scaling.evict(request)
        except errors.EngineError as exc:
            await grpc_status.abort(context, exc)

    async def ScalingRunLoad(
        self, request: pb.ScalingRunLoadRequest, context: Ctx
    ) -> pb.ScalingRunLoadReply:
        try:
            return await self.run_host.load(request)
        except errors.EngineError as exc:
            await grpc_status.abort(context, exc)

    async def ScalingBatchLimit(
        self, request: pb.ScalingBatchLimitRequest, context: Ctx
    ) -> pb.ScalingBatchLimitReply:
        try:
            return await self.scaling.batch_limit(request)
        except errors.EngineError as exc:
            await grpc_status.abort(context, exc)

    async def ScalingRunStep(
        self, request: pb.ScalingRunStepRequest, context: Ctx
    ) -> pb.ScalingRunStepReply:
        try:
            return await self.run_host.step(request)
        except errors.EngineError as exc:
            await grpc_status.abort(context, exc)

    async def ScalingRunExportKV(
        self, request: pb.ScalingRunKVRequest, context: Ctx
    ) -> AsyncIterator[pb.KVLayer]:
        try:
            for layer in self.run_host.export_kv(request):
                yield layer
        except errors.EngineError as exc:
            await grpc_status.abort(context, exc)

    async def ScalingRunImportKV(
        self, request_iterator: AsyncIterator[pb.ScalingRunKVImport], context: Ctx
    ) -> pb.ImportKVReply:
        try:
            return pb.ImportKVReply(layers=await self.run_host.import_kv(request_iterator))
        except errors.EngineError as exc:
            await grpc_status.abort(context, exc)

    async def ScalingRunUnload(
        self, request: pb.ScalingRunUnloadRequest, context: Ctx
    ) -> pb.ScalingRunUnloadReply:
        try:
            await self.run_host.unload(request.run_id)
        except errors.EngineError as exc:
            await grpc_status.abort(context, exc)
        return pb.ScalingRunUnloadReply(unloaded=True)
