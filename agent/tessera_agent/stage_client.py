"""Client side of the stage stream: the stages after this one, reached over gRPC.

A `RemoteDownstream` opens `StageStream` to the next stage's agent, checks with a hello
that the peer holds the expected stage, then sends steps and resolves their results in
order. Writes are serialized; results come back FIFO, so each submit awaits its own.
On the leader, when the return link to the last stage is formed, a step's sampled tokens
are taken from that link as soon as they arrive (the stream's empty acknowledgement
follows in order and is not waited for); a step asking for log-probabilities, or a last
stage without the link, keeps the tokens on the stream.
Used by the replica leader (`engine.replica`) and by middle stages (the servicer).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import deque
from typing import Any

import grpc
import torch

from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import convert, stage_link
from tessera_agent.engine import dtypes, errors, step


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
        self.result_link: stage_link.StageLink | None = None  # leader: tokens come back on it

    @classmethod
    async def connect(
        cls,
        address: str,
        hello: pb.StageHello,
        tls: transport.TlsFiles | None,
        timeout: float = 30.0,
    ) -> RemoteDownstream:
        channel = transport.channel(address, tls)
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
        back: asyncio.Future[torch.Tensor] | None = None
        async with self._write_lock:
            self._pending.append(fut)
            try:
                ids = _sampled_ids(inp)
                if ids and self.result_link is not None and self.result_link.ready:
                    inp = dataclasses.replace(inp, result_on_link=True)  # posted first
                    back = self.result_link.receive((len(ids),), torch.long, inp.step_id)
                link = self.link
                if link is not None and link.ready and inp.hidden is not None:
                    msg = convert.step_to_proto(dataclasses.replace(inp, hidden=None))
                    msg.step.hidden_on_link = True
                    msg.step.hidden_dtype = dtypes.name_of(inp.hidden.dtype)
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
        if back is None:
            return await fut
        return await self._tokens_on_link(inp.step_id, ids, fut, back)

    async def _tokens_on_link(
        self,
        step_id: int,
        ids: list[str],
        fut: asyncio.Future[step.StepOutput],
        back: asyncio.Future[torch.Tensor],
    ) -> step.StepOutput:
        """The step's tokens from the return link, or from the gRPC result when the last
        stage could not use the link; the stream's acknowledgement is not waited for."""
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved here
        either: list[asyncio.Future[Any]] = [fut, back]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not back.done():
            try:
                res = fut.result()
            except Exception:
                self._drop_result_link()  # its posted receive will never be answered
                raise
            if not res.tokens_on_link:  # the last stage had no link: tokens came on gRPC
                self._drop_result_link()
                return res
        try:
            tokens = await back
        except Exception as exc:
            self._drop_result_link()
            raise errors.UnavailableError(f"return link from the last stage: {exc}") from exc
        return step.StepOutput(step_id, sampled=dict(zip(ids, tokens.tolist(), strict=True)))

    def _drop_result_link(self) -> None:
        """Stop listening on the return link for good (gRPC carries the tokens)."""
        link, self.result_link = self.result_link, None
        if link is not None:
            link.close()

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


def _sampled_ids(inp: step.StepInput) -> list[str]:
    """The sequences the last stage samples in this step, in chunk order (the order of the
    tokens on the return link); empty when none, or when any asks for log-probabilities
    (those stay on the gRPC result)."""
    ids = [c.seq_id for c in inp.chunks if c.sample]
    if any(c.params.logprobs is not None for c in inp.chunks if c.sample):
        return []
    return ids
