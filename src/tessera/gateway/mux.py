"""One multiplexed `GenerateMux` stream per replica: the gateway's token path.

Owned by `replicas.ReplicaSet` (`generate`), used by `dispatch.Dispatcher._attempt` when
`GatewayConfig.generate_mux` is on: instead of one `Generate` call per request (a message per
request per decode step), each replica gets one bidirectional stream to its leader; the gateway
writes `start` and `cancel`, the agent answers with one message per batch of news
(`tessera_agent.generate_mux`). `MuxCall` behaves like a grpc.aio call: iterates
`GenerateChunk`s up to the one with a finish reason, raises `grpc.aio.AioRpcError` with the
agent's code, and `cancel()` (False once ended) cancels on the agent and raises
`asyncio.CancelledError` in the reader. Streams open lazily and are retired (`drop`) when the
replica is removed, moves or fails. A broken stream fails its requests with its status, for the
dispatcher to retry or continue. An agent answering UNIMPLEMENTED (an older release) gets
per-request `Generate` calls until the replica is dropped; nothing fails.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from tessera.rpc.v1 import agent_pb2 as pb

log = logging.getLogger(__name__)

_Item = pb.GenerateChunk | BaseException


def rpc_error(code: str | grpc.StatusCode, message: str) -> grpc.aio.AioRpcError:
    """The error a per-request call would raise, from a status code (or its name)."""
    status = code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.__members__.get(code)
    return grpc.aio.AioRpcError(
        status or grpc.StatusCode.UNKNOWN, grpc.aio.Metadata(), grpc.aio.Metadata(), message
    )


class MuxCall:
    """One request on a replica's stream (module docstring)."""

    def __init__(self, stream: MuxStream, key: str, request: pb.GenerateRequest) -> None:
        self._stream, self.key, self.request = stream, key, request
        self._items: collections.deque[_Item] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        # the per-request call it went on as (no GenerateMux), and its chunk iterator
        self._fallback: tuple[Any, AsyncIterator[pb.GenerateChunk]] | None = None
        self.ended = False  # finished, failed or cancelled: nothing more will be delivered

    def __aiter__(self) -> MuxCall:
        return self

    async def __anext__(self) -> pb.GenerateChunk:
        while not self._items:
            if self._fallback is not None:
                return await anext(self._fallback[1])
            if self.ended:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items.popleft()
        if isinstance(item, BaseException):
            raise item
        return item

    def deliver(self, item: _Item, end: bool) -> None:
        """Called by the stream's demux: the request's next chunk or its failure."""
        self._items.append(item)
        self.ended = self.ended or end
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def go_on_as(self, call: Any) -> None:
        """The stream was UNIMPLEMENTED: read (and cancel) the per-request `call` instead."""
        self._fallback = (call, call.__aiter__())
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def cancel(self) -> bool:
        """Cancel the request on the agent; False if it had already ended."""
        if self._fallback is not None:
            return bool(self._fallback[0].cancel())
        if self.ended:
            return False
        self._stream.cancel(self.key)
        self._items.clear()  # as grpc.aio drops what a cancelled call had not read
        self.deliver(asyncio.CancelledError(), end=True)
        return True


class MuxStream:
    """One GenerateMux call: the requests running on it, and the task that demuxes."""

    _ids = itertools.count()

    def __init__(self, stub: Any, on_end: Callable[[MuxStream], None]) -> None:
        self._out: asyncio.Queue[pb.GenerateMuxRequest | None] = asyncio.Queue()
        self._calls: dict[str, MuxCall] = {}
        self._on_end = on_end
        self._stub = stub
        self.retired = False
        self.broken = False
        self.unimplemented = False  # the agent has no GenerateMux
        self._half_closed = False
        self._call = stub.GenerateMux(self._requests())
        self._task = asyncio.get_running_loop().create_task(self._demux())

    @property
    def running(self) -> int:
        return len(self._calls)

    async def _requests(self) -> AsyncIterator[pb.GenerateMuxRequest]:
        while (msg := await self._out.get()) is not None:
            yield msg

    def start(self, request: pb.GenerateRequest) -> MuxCall:
        key = request.request_id
        if not key or key in self._calls:  # the agent keys the stream's requests by id
            key = f"{key}~mux{next(self._ids)}"
            renamed = pb.GenerateRequest()
            renamed.CopyFrom(request)
            renamed.request_id, request = key, renamed
        call = MuxCall(self, key, request)
        self._calls[key] = call
        self._out.put_nowait(pb.GenerateMuxRequest(start=request))
        return call

    def cancel(self, key: str) -> None:
        if self._calls.pop(key, None) is not None and not self._half_closed:
            self._out.put_nowait(pb.GenerateMuxRequest(cancel=pb.GenerateMuxCancel(request_id=key)))
        self._settle()

    def retire(self) -> None:
        """Take no new request; half-close once the running ones end."""
        self.retired = True
        self._settle()

    def _settle(self) -> None:
        if self.retired and not self._calls and not self._half_closed:
            self._half_closed = True
            self._out.put_nowait(None)

    async def _demux(self) -> None:
        err_code, err_msg = grpc.StatusCode.UNAVAILABLE, "the GenerateMux stream ended"
        try:
            async for reply in self._call:
                for entry in reply.entries:
                    call = self._calls.get(entry.request_id)
                    if call is None:  # cancelled here; the agent's news crossed the cancel
                        continue
                    if entry.HasField("error"):
                        del self._calls[entry.request_id]
                        call.deliver(rpc_error(entry.error.code, entry.error.message), True)
                    else:
                        end = bool(entry.chunk.finish_reason)
                        if end:
                            del self._calls[entry.request_id]
                        call.deliver(entry.chunk, end)
                self._settle()
        except grpc.aio.AioRpcError as exc:
            err_code, err_msg = exc.code(), exc.details() or err_code.name
        except asyncio.CancelledError:
            err_msg = "the gateway closed the GenerateMux stream"
            raise
        finally:
            self.broken = True
            self.unimplemented = err_code == grpc.StatusCode.UNIMPLEMENTED
            self._on_end(self)
            calls, self._calls = self._calls, {}
            if self.unimplemented:
                log.info("the agent has no GenerateMux (%s); %d requests go on as Generate calls",
                         err_msg, len(calls))  # fmt: skip
                for call in calls.values():
                    call.go_on_as(self._stub.Generate(call.request))
                calls = {}
            if calls:
                log.info("GenerateMux stream broke (%s: %s); failing %d requests",
                         err_code.name, err_msg, len(calls))  # fmt: skip
            for call in calls.values():
                call.deliver(rpc_error(err_code, err_msg), True)

    async def close(self) -> None:
        self._call.cancel()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class MuxPool:
    """A replica's current stream; retired streams run until their requests end."""

    def __init__(self) -> None:
        self._streams: dict[str, MuxStream] = {}
        self._all: set[MuxStream] = set()  # current and retired, until they end
        self.per_request: set[str] = set()  # replicas whose leader has no GenerateMux

    def call(self, replica_id: str, stub: Any, request: pb.GenerateRequest) -> Any:
        """A `MuxCall` on the replica's stream, or a per-request `Generate` call where the
        leader has no GenerateMux."""
        if replica_id in self.per_request:
            return stub.Generate(request)
        s = self._streams.get(replica_id)
        if s is None or s.broken or s.retired:
            s = MuxStream(stub, self._ended)
            self._streams[replica_id] = s
            self._all.add(s)
        return s.start(request)

    def _ended(self, stream: MuxStream) -> None:
        self._all.discard(stream)
        for rid, s in list(self._streams.items()):
            if s is stream:
                del self._streams[rid]
                if stream.unimplemented:
                    self.per_request.add(rid)

    def drop(self, replica_id: str) -> None:
        """The replica was removed, moved or failed: new requests get a new stream."""
        self.per_request.discard(replica_id)
        s = self._streams.pop(replica_id, None)
        if s is not None:
            s.retire()

    def running(self, replica_id: str) -> int:
        s = self._streams.get(replica_id)
        return 0 if s is None else s.running

    async def close(self) -> None:
        streams = list(self._all)
        self._streams.clear()
        self._all.clear()
        await asyncio.gather(*(s.close() for s in streams), return_exceptions=True)
