"""gRPC servicer of the agent: translates proto ↔ engine objects and delegates.

Thin by design (route_guide style): every method validates, calls into the engine
(`engine.stage`, `engine.replica`) and maps `EngineError`s to gRPC statuses whose message
names the cause. Created by `server.py`; one instance per agent process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import torch

from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import (
    convert,
    devices,
    grpc_status,
    hosted,
    kv_transfer,
    metrics,
    stage_client,
    stage_server,
    tensor_transfer,
)
from tessera_agent.engine import errors, loader, profiler, replica, scheduler, stage

log = logging.getLogger(__name__)


class AgentServicer(pb_grpc.AgentServicer):
    def __init__(
        self,
        agent_id: str,
        devs: list[devices.Device],
        nvml_status: str,
        version: str,
        prefix_caching: bool = True,
    ) -> None:
        self.agent_id, self.nvml_status, self.version = agent_id, nvml_status, version
        self.prefix_caching = prefix_caching
        self.devices = {d.id: d for d in devs}
        self.hosted: dict[tuple[str, int], hosted.Hosted] = {}
        self.compute = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="compute")
        self.loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="loader")
        self._load_lock = asyncio.Lock()
        self.metrics = metrics.AgentMetrics(self)

    async def close(self) -> None:
        for h in list(self.hosted.values()):
            if h.leader is not None:
                await h.leader.close()
        self.compute.shutdown(wait=False, cancel_futures=True)
        self.loader.shutdown(wait=False, cancel_futures=True)

    # -- inventory ----------------------------------------------------------------------
    def _blocks(self) -> list[pb.BlockInfo]:
        return [
            convert.block_info(h.stage, h.num_stages, h.next_address)
            for _, h in sorted(self.hosted.items())
        ]

    async def Describe(
        self, request: pb.DescribeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeReply:
        kv = []
        for (rid, _), h in sorted(self.hosted.items()):
            if h.leader is not None:
                s = h.leader.stats()
                kv.append(
                    pb.ReplicaKV(
                        replica_id=rid,
                        pages_total=s.kv_pages_total,
                        pages_used=s.kv_pages_used,
                        running=s.running,
                        waiting=s.waiting,
                        preemptions=s.preemptions,
                        prefix_hit_tokens=s.prefix_hit_tokens,
                        cached_pages=s.cached_pages,
                    )
                )
        return pb.DescribeReply(
            agent_id=self.agent_id,
            nvml_status=self.nvml_status,
            version=self.version,
            devices=[
                pb.Device(
                    id=d.id,
                    kind=d.kind,
                    name=d.name,
                    capacity_bytes=d.capacity_bytes,
                    free_bytes=d.free_bytes,
                )
                for d in self.devices.values()
            ],
            blocks=self._blocks(),
            kv=kv,
        )

    async def ListBlocks(
        self, request: pb.ListBlocksRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListBlocksReply:
        return pb.ListBlocksReply(blocks=self._blocks())

    # -- loading ------------------------------------------------------------------------
    async def LoadBlock(
        self, request: pb.LoadBlockRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.LoadBlockReply:
        try:
            return await self._load(request)
        except errors.EngineError as exc:
            await grpc_status.abort(context, exc)

    async def _load(self, req: pb.LoadBlockRequest) -> pb.LoadBlockReply:
        spec = stage.BlockSpec(
            model_path=req.model_path,
            start=req.layer_start,
            end=req.layer_end,
            replica_id=req.replica_id,
            stage_index=req.stage_index,
            device=req.device,
            dtype=req.dtype or "float32",
            kv_bytes=req.kv_bytes,
            page_size=req.page_size or stage.DEFAULT_PAGE_SIZE,
        )
        if not req.replica_id:
            raise errors.InvalidArgumentError("replica_id: must not be empty")
        num_stages = req.num_stages or 1
        if not 0 <= req.stage_index < num_stages:
            raise errors.InvalidArgumentError(
                f"stage_index: {req.stage_index} is outside [0, {num_stages})"
            )
        async with self._load_lock:
            key = (spec.replica_id, spec.stage_index)
            if key in self.hosted:
                h = self.hosted[key]
                if h.stage.spec == spec and h.next_address == req.next_stage_address:
                    return pb.LoadBlockReply(
                        block=convert.block_info(h.stage, h.num_stages, h.next_address),
                        already_loaded=True,
                    )
                raise errors.FailedPreconditionError(
                    f"replica {spec.replica_id} stage {spec.stage_index} is already loaded "
                    f"with layers [{h.stage.spec.start}, {h.stage.spec.end}) on "
                    f"{h.stage.spec.device}; unload it first"
                )
            dev = self.devices.get(spec.device)
            if dev is None:
                raise errors.NotFoundError(
                    f"device {spec.device!r} is not on agent {self.agent_id} "
                    f"(devices: {', '.join(self.devices)})"
                )
            copy = req.HasField("source")
            planned = await asyncio.get_running_loop().run_in_executor(
                self.loader, stage.plan_bytes, spec, not copy
            )
            cfg = planned[0]
            is_last = spec.end == cfg.num_layers
            if (spec.start == 0) != (spec.stage_index == 0):
                raise errors.InvalidArgumentError(
                    f"stage_index: stage {spec.stage_index} cannot start at layer {spec.start} "
                    "(only stage 0 starts at layer 0)"
                )
            if is_last != (spec.stage_index == num_stages - 1):
                raise errors.InvalidArgumentError(
                    f"num_stages: stage {spec.stage_index} of {num_stages} ends at layer "
                    f"{spec.end} of {cfg.num_layers}; only the last stage ends the model"
                )
            if not is_last and not req.next_stage_address:
                raise errors.InvalidArgumentError(
                    "next_stage_address: required for a stage that does not end the model"
                )
            tensors = None
            if copy:  # refuse before transferring anything when the block cannot fit
                stage.kv_pages(spec, cfg, planned[1], dev.free_bytes)
                names = loader.checkpoint_names(cfg, spec.start, spec.end)
                tensors = await tensor_transfer.fetch(req.source, names)
            loaded = await asyncio.get_running_loop().run_in_executor(
                self.loader,
                stage.load_stage,
                spec,
                dev.torch_device(),
                dev.free_bytes,
                planned,
                tensors,
            )
            h = hosted.Hosted(loaded, num_stages, req.next_stage_address)
            dev.used[h.holder] = loaded.param_bytes + loaded.kv_bytes
            if spec.stage_index == 0:
                h.leader = self._make_leader(h, req)
            self.hosted[key] = h
            how = f"copied from {req.source.address}" if copy else "read from the checkpoint"
            log.info(
                "loaded %s layers [%d, %d) on %s, %s", h.holder, spec.start, spec.end, dev.id, how
            )
            return pb.LoadBlockReply(block=convert.block_info(loaded, num_stages, h.next_address))

    def _make_leader(self, h: hosted.Hosted, req: pb.LoadBlockRequest) -> replica.ReplicaEngine:
        st = h.stage
        defaults = scheduler.SchedulerConfig
        cfg = scheduler.SchedulerConfig(
            max_num_seqs=req.max_num_seqs or defaults.max_num_seqs,
            max_batched_tokens=req.max_batched_tokens or defaults.max_batched_tokens,
            max_model_len=st.cfg.max_positions,
            eos_token_ids=st.cfg.eos_token_ids,
            prefix_caching=self.prefix_caching,
        )
        connect = None
        if h.num_stages > 1:
            hello = pb.StageHello(
                replica_id=st.spec.replica_id,
                stage_index=1,
                layer_start=st.spec.end,
                model_path=st.spec.model_path,
            )
            address = h.next_address

            async def connect() -> replica.Downstream:
                return await stage_client.RemoteDownstream.connect(address, hello)

        return replica.ReplicaEngine(st.runner, self.compute, cfg, connect)

    async def UnloadBlock(
        self, request: pb.UnloadBlockRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.UnloadBlockReply:
        async with self._load_lock:
            h = self.hosted.pop((request.replica_id, request.stage_index), None)
            if h is None:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    f"replica {request.replica_id} has no stage "
                    f"{request.stage_index} on agent {self.agent_id}",
                )
                raise AssertionError("unreachable")
            if h.leader is not None:
                await h.leader.close()
            self.devices[h.stage.spec.device].used.pop(h.holder, None)
            log.info("unloaded %s", h.holder)
            return pb.UnloadBlockReply(unloaded=True)

    async def FetchTensors(
        self, request: pb.FetchTensorsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.TensorChunk]:
        h = self.hosted.get((request.replica_id, request.stage_index))
        try:
            if h is None:
                raise errors.NotFoundError(
                    f"replica {request.replica_id} has no stage {request.stage_index} "
                    f"on agent {self.agent_id}"
                )
            tensors = tensor_transfer.held(h.stage, list(request.names))
            for chunk in tensor_transfer.chunks(tensors, request.chunk_bytes):
                yield chunk
        except errors.EngineError as exc:
            await grpc_status.abort(context, exc)

    # -- KV movement --------------------------------------------------------------------
    def _leader(self, replica_id: str) -> replica.ReplicaEngine:
        h = self.hosted.get((replica_id, 0))
        if h is None or h.leader is None:
            raise errors.NotFoundError(
                f"replica {replica_id!r} is not led by agent {self.agent_id} (no stage 0 here)"
            )
        return h.leader

    def _stage(self, replica_id: str, stage_index: int) -> stage.Stage:
        h = self.hosted.get((replica_id, stage_index))
        if h is None:
            raise errors.NotFoundError(
                f"replica {replica_id} has no stage {stage_index} on agent {self.agent_id}"
            )
        return h.stage

    @staticmethod
    def _pin_reply(pin: replica.Pin) -> pb.PinReply:
        return pb.PinReply(
            pin_id=pin.pin_id,
            page_ids=list(pin.page_ids),
            num_tokens=pin.num_tokens,
            page_size=pin.page_size,
        )

    async def PinPrefix(
        self, request: pb.PinPrefixRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PinReply:
        try:
            leader = self._leader(request.replica_id)
            return self._pin_reply(await leader.pin_prefix(list(request.token_ids)))
        except errors.EngineError as exc:
            await grpc_status.abort(context, exc)

    async def ReservePages(
        self, request: pb.ReservePagesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PinReply:
        try:
            leader = self._leader(request.replica_id)
            return self._pin_reply(await leader.reserve_pages(request.num_pages))
        except errors.EngineError as exc:
            await grpc_status.abort(context, exc)

    async def CommitPrefix(
        self, request: pb.CommitPrefixRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CommitPrefixReply:
        try:
            leader = self._leader(request.replica_id)
            n = await leader.commit_prefix(request.pin_id, list(request.token_ids))
            return pb.CommitPrefixReply(registered_pages=n)
        except errors.EngineError as exc:
            await grpc_status.abort(context, exc)

    async def ReleasePin(
        self, request: pb.ReleasePinRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ReleasePinReply:
        try:
            self._leader(request.replica_id).release_pin(request.pin_id)
            return pb.ReleasePinReply(released=True)
        except errors.EngineError as exc:
            await grpc_status.abort(context, exc)

    async def ExportKV(
        self, request: pb.ExportKVRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.KVLayer]:
        try:
            st = self._stage(request.replica_id, request.stage_index)
            layers = kv_transfer.export_layers(
                st, list(request.page_ids), request.layer_start, request.layer_end
            )
            for layer in layers:
                yield layer
        except errors.EngineError as exc:
            await grpc_status.abort(context, exc)

    async def ImportKV(
        self,
        request_iterator: AsyncIterator[pb.KVImportMessage],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.ImportKVReply:
        n = 0
        try:
            first = await anext(request_iterator, None)
            if first is None or not first.HasField("header"):
                raise errors.InvalidArgumentError("ImportKV: the first message must be a header")
            head = first.header
            st = self._stage(head.replica_id, head.stage_index)
            pages = kv_transfer.valid_pages(st, head.page_ids)
            async for msg in request_iterator:
                if not msg.HasField("layer"):
                    raise errors.InvalidArgumentError("ImportKV: one header, then layers")
                kv_transfer.import_layer(st, pages, msg.layer)
                n += 1
        except errors.EngineError as exc:
            await grpc_status.abort(context, exc)
        return pb.ImportKVReply(layers=n)

    # -- stage stream -------------------------------------------------------------------
    async def StageStream(
        self,
        request_iterator: AsyncIterator[pb.StageMessage],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.StageResult]:
        async for reply in stage_server.serve(
            self.hosted, self.agent_id, self.compute, request_iterator, context
        ):
            yield reply

    # -- generation ---------------------------------------------------------------------
    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.GenerateChunk]:
        h = self.hosted.get((request.replica_id, 0))
        if h is None or h.leader is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"replica {request.replica_id!r} is not led by agent "
                f"{self.agent_id} (no stage 0 here)",
            )
            return
        prompt = list(request.prompt_token_ids)
        n = 0
        outcome = "cancelled"  # unless the stream reaches its end or fails
        try:
            params = convert.sampling_from_proto(request.params)
            vocab = h.stage.cfg.vocab_size
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise errors.InvalidArgumentError(
                    f"prompt_token_ids: {bad[0]} is outside the vocabulary [0, {vocab})"
                )
            rid = request.request_id or uuid.uuid4().hex
            self.metrics.prompt_tokens.labels(request.replica_id).inc(len(prompt))
            # One message per batch of ready events, not one per token.
            async for batch in h.leader.generate_batches(rid, prompt, params):
                new = sum(ev.token is not None for ev in batch)
                n += new
                self.metrics.generated_tokens.labels(request.replica_id).inc(new)
                outcome = batch[-1].finish_reason or outcome
                yield convert.chunk_from_events(batch, len(prompt), n)
        except errors.EngineError as exc:
            outcome = grpc_status.code(exc).name.lower()
            await grpc_status.abort(context, exc)
        finally:
            self.metrics.requests.labels(request.replica_id, outcome).inc()

    async def Cancel(
        self, request: pb.CancelRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CancelReply:
        h = self.hosted.get((request.replica_id, 0))
        if h is None or h.leader is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"replica {request.replica_id!r} is not led by this agent",
            )
            raise AssertionError("unreachable")
        h.leader.cancel(request.request_id)
        return pb.CancelReply(cancelled=True)

    async def Profile(
        self, request: pb.ProfileRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ProfileReply:
        dev = self.devices.get(request.device or next(iter(self.devices)))
        if dev is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"device {request.device!r} is not on agent {self.agent_id}",
            )
            raise AssertionError("unreachable")
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
        except (errors.EngineError, FileNotFoundError) as exc:
            await grpc_status.abort(context, exc)
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
