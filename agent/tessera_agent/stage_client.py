"""Client side of the stage stream: the stages after this one, reached over gRPC.

A `RemoteDownstream` opens `StageStream` to the next stage's agent, checks with a hello
that the peer holds the expected stage, then sends steps and resolves their results in
order. Writes are serialized; results come back FIFO, so each submit awaits its own.
Used by the replica leader (`engine.replica`) and by middle stages (the servicer).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import deque

import grpc

from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import convert, stage_link
from tessera_agent.engine import errors, step


class RemoteDownstream:
    """The pipeline after this stage, behind one bidirectional stream."""

    def __init__(
        self,
        address: str,
        channel: grpc.aio.Channel,
        call: grpc.aio.StreamStreamCall,
        num_pages: int,
    ) -> None:
        self.address, self.num_pages = address, num_pages
        self._channel, self._call = channel, call
        self._pending: deque[asyncio.Future[step.StepOutput]] = deque()
        self._write_lock = asyncio.Lock()
        self._closed = False
        self._reader = asyncio.create_task(self._read_loop(), name=f"stage-reader-{address}")
        self.link: stage_link.StageLink | None = None  # set by the owner when there is one

    @classmethod
    async def connect(
        cls, address: str, hello: pb.StageHello, timeout: float = 30.0
    ) -> RemoteDownstream:
        channel = transport.channel(address)
        try:
            stub = pb_grpc.AgentStub(channel)
            call = stub.StageStream()
            await call.write(pb.StageMessage(hello=hello))
            reply = await asyncio.wait_for(call.read(), timeout)
        except grpc.aio.AioRpcError as exc:
            await channel.close()
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise errors.FailedPreconditionError(exc.details() or "") from exc
            raise errors.UnavailableError(
                f"stage {hello.stage_index} of replica {hello.replica_id} at {address} is "
                f"unreachable: {exc.code().name}: {exc.details()}"
            ) from exc
        except TimeoutError as exc:
            await channel.close()
            raise errors.UnavailableError(
                f"stage at {address} did not answer in {timeout}s"
            ) from exc
        if reply is grpc.aio.EOF or not reply.HasField("hello"):
            await channel.close()
            raise errors.UnavailableError(f"stage at {address} closed the stream")
        return cls(address, channel, call, reply.hello.num_pages)

    async def submit(self, inp: step.StepInput) -> step.StepOutput:
        if self._closed:
            raise errors.UnavailableError(f"stage stream to {self.address} is closed")
        fut: asyncio.Future[step.StepOutput] = asyncio.get_running_loop().create_future()
        sent: asyncio.Future[None] | None = None
        async with self._write_lock:
            self._pending.append(fut)
            try:
                link = self.link
                if link is not None and link.ready and inp.hidden is not None:
                    msg = convert.step_to_proto(dataclasses.replace(inp, hidden=None))
                    msg.step.hidden_on_link = True
                    msg.step.hidden_dtype = str(inp.hidden.dtype).removeprefix("torch.")
                    await self._call.write(msg)
                    sent = link.send(inp.hidden, inp.step_id)  # in stream order
                else:
                    await self._call.write(convert.step_to_proto(inp))
            except Exception as exc:
                self._fail(errors.UnavailableError(f"stage stream to {self.address}: {exc}"))
        if sent is not None:
            try:
                await sent
            except Exception as exc:
                self._fail(errors.UnavailableError(f"stage link to {self.address}: {exc}"))
        return await fut

    async def _read_loop(self) -> None:
        try:
            while True:
                msg = await self._call.read()
                if msg is grpc.aio.EOF:
                    raise errors.UnavailableError(f"stage at {self.address} ended the stream")
                if not self._pending:
                    continue
                fut = self._pending.popleft()
                if not fut.done():
                    fut.set_result(convert.result_from_proto(msg.step))
        except asyncio.CancelledError:
            self._fail(errors.UnavailableError("stage stream closed"))
            raise
        except grpc.aio.AioRpcError as exc:
            self._fail(
                errors.UnavailableError(
                    f"stage at {self.address} failed: {exc.code().name}: {exc.details()}"
                )
            )
        except Exception as exc:
            self._fail(errors.UnavailableError(f"stage at {self.address} failed: {exc}"))

    def _fail(self, exc: Exception) -> None:
        self._closed = True
        while self._pending:
            fut = self._pending.popleft()
            if not fut.done():
                fut.set_exception(exc)

    async def close(self) -> None:
        self._closed = True
        self._reader.cancel()
        with contextlib.suppress(BaseException):
            await self._reader
        self._call.cancel()
        await self._channel.close()
