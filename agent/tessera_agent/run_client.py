"""A replica of a layer run on another agent, seen by the stage that owns the run.

`RemoteHolder` implements `engine.run_holders.Holder` over the `ScalingRun*` RPCs of the
agent holding the copy: `load` asks it to load the layers (weights copied from this
stage's agent), `submit` sends one step's sub-batch and returns its hidden states,
`export_pages` / `import_pages` move K/V pages, `close` unloads it. The engine calls these
from the compute thread, so each schedules its coroutine on the agent's event loop and
waits for it there (the loop is never the caller). Created by `scaling_control`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import grpc
import torch

from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import convert
from tessera_agent.engine import errors, run_holders, step

T = TypeVar("T")


def _unavailable(address: str, exc: grpc.aio.AioRpcError) -> errors.EngineError:
    if exc.code() == grpc.StatusCode.NOT_FOUND:
        return errors.NotFoundError(exc.details() or "")
    if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.ResourceExhaustedError(exc.details() or "")
    if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
        return errors.InvalidArgumentError(exc.details() or "")
    return errors.UnavailableError(
        f"layer-run replica at {address}: {exc.code().name}: {exc.details()}"
    )


class RemoteHolder:
    def __init__(
        self,
        address: str,
        run_id: str,
        reply: pb.ScalingRunLoadReply,
        channel: grpc.aio.Channel,
    ) -> None:
        self.address, self.run_id, self.name = address, run_id, reply.holder
        self.param_bytes, self.kv_bytes = reply.param_bytes, reply.kv_bytes
        self.transport = reply.transport
        self._channel = channel
        self._stub = pb_grpc.AgentStub(channel)
        self._loop = asyncio.get_running_loop()

    @classmethod
    async def load(
        cls, address: str, req: pb.ScalingRunLoadRequest, tls: transport.TlsFiles | None
    ) -> RemoteHolder:
        channel = transport.channel(address, tls)
        try:
            reply = await pb_grpc.AgentStub(channel).ScalingRunLoad(req, timeout=120.0)
        except grpc.aio.AioRpcError as exc:
            await channel.close()
            raise _unavailable(address, exc) from exc
        return cls(address, req.run_id, reply, channel)

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _step(
        self, step_id: int, chunks: list[step.SeqChunk], hidden: torch.Tensor
    ) -> tuple[torch.Tensor, float]:
        msg = convert.step_to_proto(step.StepInput(step_id, chunks, hidden=hidden)).step
        t0 = time.perf_counter()
        try:
            reply = await self._stub.ScalingRunStep(
                pb.ScalingRunStepRequest(run_id=self.run_id, step=msg), timeout=60.0
            )
        except grpc.aio.AioRpcError as exc:
            raise _unavailable(self.address, exc) from exc
        return convert.tensor_from_proto(reply.hidden), time.perf_counter() - t0

    def submit(
        self, step_id: int, chunks: list[step.SeqChunk], hidden: torch.Tensor
    ) -> concurrent.futures.Future[tuple[torch.Tensor, float]]:
        return asyncio.run_coroutine_threadsafe(self._step(step_id, chunks, hidden), self._loop)

    async def _export(self, pages: list[int]) -> run_holders.KV:
        out: run_holders.KV = []
        try:
            call = self._stub.ScalingRunExportKV(
                pb.ScalingRunKVRequest(run_id=self.run_id, page_ids=pages), timeout=120.0
            )
            async for layer in call:
                out.append((convert.tensor_from_proto(layer.k), convert.tensor_from_proto(layer.v)))
        except grpc.aio.AioRpcError as exc:
            raise _unavailable(self.address, exc) from exc
        return out

    def export_pages(self, pages: list[int]) -> run_holders.KV:
        return self._wait(self._export(pages))

    async def _import(self, pages: list[int], kv: run_holders.KV) -> None:
        msgs = [
            pb.ScalingRunKVImport(header=pb.ScalingRunKVRequest(run_id=self.run_id, page_ids=pages))
        ]
        msgs += [
            pb.ScalingRunKVImport(
                layer=pb.KVLayer(
                    layer=i, k=convert.tensor_to_proto(k), v=convert.tensor_to_proto(v)
                )
            )
            for i, (k, v) in enumerate(kv)
        ]
        try:
            await self._stub.ScalingRunImportKV(iter(msgs), timeout=120.0)
        except grpc.aio.AioRpcError as exc:
            raise _unavailable(self.address, exc) from exc

    def import_pages(self, pages: list[int], kv: run_holders.KV) -> None:
        self._wait(self._import(pages, kv))

    async def _unload(self) -> None:
        try:
            await self._stub.ScalingRunUnload(
                pb.ScalingRunUnloadRequest(run_id=self.run_id), timeout=30.0
            )
        except grpc.aio.AioRpcError:
            pass  # the peer is gone: nothing left to release there
        finally:
            await self._channel.close()

    def close(self) -> None:
        """Unload the copy on its agent (in the background; the caller does not wait)."""
        asyncio.run_coroutine_threadsafe(self._unload(), self._loop)
