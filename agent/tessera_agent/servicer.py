"""gRPC servicer of the agent: translates proto ↔ engine objects and delegates.

Thin by design (route_guide style): every method converts the request
(`tessera.rpc.blocks`, `convert`), delegates (`hosting` loads, rewires, unloads and looks
blocks up; `booking` holds the memory; `leader` builds replica engines with the
`load_config.LoadDefaults`; `stage_server`, `generate_mux` and the engine do the work)
and maps `EngineError`s to gRPC statuses (`grpc_status`) whose message names the cause.
The KV, tensor and `Scaling*` RPCs are mixins (`kv_rpc`, `tensor_rpc`, `scaling_rpc`).
Created by `server.py`; one instance per agent process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import torch

from tessera.policies.serving import block_batching
from tessera.rpc import blocks as rpc_blocks
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import (
    booking,
    convert,
    devices,
    generate_mux,
    grpc_status,
    hosted,
    hosting,
    kv_rpc,
    load_config,
    load_sources,
    metrics,
    overload_shift,
    scaling_control,
    scaling_host,
    scaling_rpc,
    sleep,
    stage_server,
    tensor_rpc,
    variants,
)
from tessera_agent.engine import cobatch as cobatch_mod
from tessera_agent.engine import errors, profiler

log = logging.getLogger(__name__)


class AgentServicer(
    kv_rpc.KVRPCs, tensor_rpc.TensorRPCs, scaling_rpc.ScalingRPCs, pb_grpc.AgentServicer
):
    def __init__(
        self,
        agent_id: str,
        devs: list[devices.Device],
        nvml_status: str,
        version: str,
        prefix_caching: bool = True,
        defaults: load_config.LoadDefaults | None = None,
        store_address: str = "",
        cobatch: block_batching.BatchLimits | None = None,
    ) -> None:
        self.agent_id, self.nvml_status, self.version = agent_id, nvml_status, version
        self.store_address = store_address  # this agent's rendezvous store (data plane)
        defaults = defaults or load_config.LoadDefaults(prefix_caching=prefix_caching)
        self.defaults = defaults
        self.memory = booking.Booking(agent_id, devs)
        self.devices = self.memory.devices
        # One compute thread; co-batching the steps of chains that share blocks unless off.
        self.compute: concurrent.futures.Executor = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="compute")
            if cobatch is None
            else cobatch_mod.CoBatchExecutor(cobatch)
        )
        self.hosting = hosting.Hosting(agent_id, self.memory, defaults, self.compute, store_address)
        self.hosted = self.hosting.hosted  # read by the metrics collector and StageStream
        # Module-level scaling (scaling_rpc.py): runs of this agent's stages, runs held here.
        self.scaling = scaling_control.ScalingControl(
            agent_id, self.hosting, self.memory, self.compute
        )
        self.run_host = scaling_host.RunHost(
            agent_id,
            self.memory,
            self.compute,
            store_address,
            defaults.run_load_delay_s,
            defaults.tls,
        )
        self.metrics = metrics.AgentMetrics(self)
        self.sleepers = sleep.Sleepers(self.hosting, on_change=self.metrics.slept_or_woke)

    async def close(self) -> None:
        await self.hosting.close()
        self.compute.shutdown(wait=False, cancel_futures=True)

    # -- inventory ----------------------------------------------------------------------
    def _blocks(self) -> list[pb.BlockInfo]:
        return [
            self._with_load(
                variants.annotate(rpc_blocks.to_proto(b, st.num_pages, len(st.tensor_names())), st)
            )
            for b, st in self.hosting.held()
        ] + [rpc_blocks.to_proto(b, n, 0) for b, n in self.sleepers.blocks()]  # asleep (issue 32)

    def _with_load(self, info: pb.BlockInfo) -> pb.BlockInfo:
        """Where the block's bytes came from and its time to ready (issue 32)."""
        key = (info.replica_id, info.stage_index)
        h = self.hosting.hosted.get(key)
        if h is not None and h.stage.spec.tp_rank != info.tp_rank:  # another rank held here
            h = self.hosting.more_ranks.get((*key, info.tp_rank))
        if h is not None:
            info.load.CopyFrom(h.sources.to_proto())
            info.piece_digests.update(load_sources.digests_of(h.stage))
        return info

    async def Describe(
        self, request: pb.DescribeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeReply:
        kv = [
            convert.replica_kv(rid, h.leader.stats())
            for (rid, _), h in sorted(self.hosted.items())
            if h.leader is not None
        ] + [pb.ReplicaKV(replica_id=rid, sleeping=True) for rid in self.sleepers.leading()]
        return pb.DescribeReply(
            agent_id=self.agent_id,
            nvml_status=self.nvml_status,
            version=self.version,
            devices=[convert.device_to_proto(d) for d in self.devices.values()],
            blocks=self._blocks(),
            kv=kv,
            store_address=self.store_address,
            zoo=variants.zoo_to_proto(self.hosting.zoo),
            scaling_runs=self.scaling.describe(),
            scaling_hosted=self.run_host.describe(),
            scaling_pending=self.scaling.describe_pending(),
            host_cache=load_sources.cache_to_proto(self.hosting.host_cache),
        )

    async def ListBlocks(
        self, request: pb.ListBlocksRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListBlocksReply:
        return pb.ListBlocksReply(blocks=self._blocks())

    # -- loading ------------------------------------------------------------------------
    @grpc_status.unary
    async def LoadBlock(
        self, request: pb.LoadBlockRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.LoadBlockReply:
        try:
            spec = rpc_blocks.from_load_request(
                request, self.defaults.dtype, self.defaults.page_size
            )
        except ValueError as exc:
            raise errors.InvalidArgumentError(str(exc)) from exc
        done = await self.hosting.load(
            spec,
            request.source if request.HasField("source") else None,
            request.max_num_seqs,
            request.max_batched_tokens,
            request.data_plane if request.HasField("data_plane") else None,
            request.switch_sources,
        )
        st = done.hosted.stage
        held = hosted.observed(done.hosted)
        return pb.LoadBlockReply(
            block=self._with_load(
                variants.annotate(
                    rpc_blocks.to_proto(held, st.num_pages, len(st.tensor_names())), st
                )
            ),
            already_loaded=done.how != "loaded",
        )

    @grpc_status.unary
    async def UnloadBlock(
        self, request: pb.UnloadBlockRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.UnloadBlockReply:
        rank = request.tp_rank if request.HasField("tp_rank") else None
        if not self.sleepers.forget(request.replica_id, request.stage_index):
            await self.hosting.unload(request.replica_id, request.stage_index, rank)
        return pb.UnloadBlockReply(unloaded=True)

    # -- overload shifts (issue 13) ---------------------------------------------------------
    @grpc_status.unary
    async def OverloadShift(
        self, request: pb.OverloadShiftRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.OverloadShiftReply:
        return await overload_shift.apply(self.hosting, request)

    # -- stage stream -------------------------------------------------------------------
    async def StageStream(
        self,
        request_iterator: AsyncIterator[pb.StageMessage],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.StageResult]:
        async for reply in stage_server.serve(
            self.hosted, self.agent_id, self.compute, request_iterator, context, self.defaults.tls
        ):
            yield reply

    # -- generation ---------------------------------------------------------------------
    @grpc_status.streaming
    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.GenerateChunk]:
        await self.sleepers.awake(request.replica_id)  # a request wakes a sleeper
        async for chunk in generate_mux.chunks(self.hosted, self.agent_id, self.metrics, request):
            yield chunk

    async def GenerateMux(
        self,
        request_iterator: AsyncIterator[pb.GenerateMuxRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.GenerateMuxReply]:
        async for reply in generate_mux.serve(
            self.hosted, self.agent_id, self.metrics, request_iterator, self.sleepers.awake
        ):
            yield reply

    # -- sleep and wake (issue 32) ------------------------------------------------------
    @grpc_status.unary
    async def SleepReplica(
        self, request: pb.SleepReplicaRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.SleepReplicaReply:
        out = await self.sleepers.sleep(request.replica_id)
        return pb.SleepReplicaReply(
            sleeping=True,
            offloaded_bytes=out.param_bytes,
            released_kv_bytes=out.kv_bytes,
            seconds=out.seconds,
        )

    @grpc_status.unary
    async def WakeReplica(
        self, request: pb.WakeReplicaRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.WakeReplicaReply:
        out = await self.sleepers.wake(request.replica_id)
        return pb.WakeReplicaReply(awake=True, restored_bytes=out.param_bytes, seconds=out.seconds)

    @grpc_status.unary
    async def VariantAdapters(
        self, request: pb.VariantAdaptersRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.VariantAdaptersReply:
        h = self.hosting.get(request.replica_id, request.stage_index)
        names, nbytes = await variants.set_adapters(
            h,
            [(a.name, a.path) for a in request.adapters],
            self.hosting.loader,
            self.compute,
            request.drain_timeout_s,
        )
        return pb.VariantAdaptersReply(variants=names, adapter_bytes=nbytes)

    @grpc_status.unary
    async def Cancel(
        self, request: pb.CancelRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CancelReply:
        h = self.hosted.get((request.replica_id, 0))
        if h is None or h.leader is None:
            raise errors.NotFoundError(f"replica {request.replica_id!r} is not led by this agent")
        h.leader.cancel(request.request_id)
        return pb.CancelReply(cancelled=True)

    @grpc_status.unary
    async def Profile(
        self, request: pb.ProfileRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ProfileReply:
        dev = self.devices.get(request.device or next(iter(self.devices)))
        if dev is None:
            raise errors.NotFoundError(f"device {request.device!r} is not on agent {self.agent_id}")
        try:
            timings = await asyncio.get_running_loop().run_in_executor(
                self.compute,
                lambda: profiler.profile(
                    request.model_path,
                    dev.torch_device(),
                    list(request.prefill_tokens),
                    list(request.decode_batches),
                    list(request.context_lens),
                    request.repeats or 5,
                ),
            )
        except FileNotFoundError as exc:
            raise errors.NotFoundError(str(exc)) from exc
        return pb.ProfileReply(
            device=dev.id,
            device_kind=dev.kind,
            torch_threads=torch.get_num_threads(),
            timings=[
                pb.LayerTiming(
                    kind=t.kind,
                    size=t.size,
                    context_len=t.context_len,
                    tp=1,
                    seconds_per_layer=t.seconds_per_layer,
                )
                for t in timings
            ],
        )
