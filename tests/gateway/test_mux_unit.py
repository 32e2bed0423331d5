"""The gateway's multiplexed token stream (`gateway/mux.py`) against a fake agent stream:
demultiplexing, cancel, a request's own error, a broken stream failing every request on
it, retirement, and one stream per replica."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from tessera.gateway import config, mux
from tessera.rpc.v1 import agent_pb2 as pb


class FakeCall:
    """A grpc.aio stream-stream call: records what the gateway writes, replies on demand."""

    def __init__(self, requests: AsyncIterator[pb.GenerateMuxRequest]) -> None:
        self.sent: list[pb.GenerateMuxRequest] = []
        self.half_closed = asyncio.Event()
        self._replies: asyncio.Queue[pb.GenerateMuxReply | BaseException] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read(requests))

    async def _read(self, requests: AsyncIterator[pb.GenerateMuxRequest]) -> None:
        async for msg in requests:
            self.sent.append(msg)
        self.half_closed.set()

    def reply(self, *entries: pb.GenerateMuxEntry) -> None:
        self._replies.put_nowait(pb.GenerateMuxReply(entries=entries))

    def fail(self, exc: BaseException) -> None:
        self._replies.put_nowait(exc)

    def __aiter__(self) -> FakeCall:
        return self

    async def __anext__(self) -> pb.GenerateMuxReply:
        item = await self._replies.get()
        if isinstance(item, StopAsyncIteration | BaseException):
            raise item
        return item

    def cancel(self) -> bool:
        self._replies.put_nowait(asyncio.CancelledError())
        return True


class FakeStub:
    def __init__(self) -> None:
        self.calls: list[FakeCall] = []

    def GenerateMux(self, requests: AsyncIterator[pb.GenerateMuxRequest]) -> FakeCall:
        call = FakeCall(requests)
        self.calls.append(call)
        return call


def _chunk(rid: str, *ids: int, reason: str = "") -> pb.GenerateMuxEntry:
    return pb.GenerateMuxEntry(
        request_id=rid, chunk=pb.GenerateChunk(token_ids=ids, finish_reason=reason)
    )


def _req(rid: str) -> pb.GenerateRequest:
    return pb.GenerateRequest(replica_id="r0", request_id=rid, prompt_token_ids=[1, 2])


async def _drain(call: mux.MuxCall) -> list[int]:
    return [t async for msg in call for t in msg.token_ids]


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_message_feeds_every_request_on_the_stream() -> None:
    pool, stub = mux.MuxPool(), FakeStub()
    a, b = pool.call("r0", stub, _req("a")), pool.call("r0", stub, _req("b"))
    assert len(stub.calls) == 1  # one stream per replica
    (agent,) = stub.calls
    ta, tb = asyncio.create_task(_drain(a)), asyncio.create_task(_drain(b))
    agent.reply(_chunk("a", 7), _chunk("b", 9))
    agent.reply(_chunk("b", 10, reason="length"), _chunk("a", 8, 11, reason="stop"))
    assert await ta == [7, 8, 11] and await tb == [9, 10]
    await _settle()
    assert [m.start.request_id for m in agent.sent] == ["a", "b"]
    assert pool.running("r0") == 0 and not a.cancel()  # ended: cancel is a no-op
    await pool.close()


async def test_cancel_tells_the_agent_and_raises_in_the_reader() -> None:
    pool, stub = mux.MuxPool(), FakeStub()
    a, b = pool.call("r0", stub, _req("a")), pool.call("r0", stub, _req("b"))
    (agent,) = stub.calls

    async def read() -> int:
        try:
            await _drain(a)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None
            return task.cancelling()  # the dispatcher tells a redirect from a task cancel so
        return -1

    reader = asyncio.create_task(read())
    await _settle()
    assert a.cancel() and not a.cancel()
    assert await reader == 0  # like grpc.aio: the read raises; the task was not cancelled
    agent.reply(_chunk("a", 1), _chunk("b", 2, reason="length"))  # news crossing the cancel
    assert await _drain(b) == [2]
    await _settle()
    assert agent.sent[-1].cancel.request_id == "a"
    await pool.close()


async def test_a_requests_error_fails_that_request_only() -> None:
    pool, stub = mux.MuxPool(), FakeStub()
    a, b = pool.call("r0", stub, _req("a")), pool.call("r0", stub, _req("b"))
    (agent,) = stub.calls
    err = pb.GenerateMuxError(code="RESOURCE_EXHAUSTED", message="needs 9 pages, has 4")
    agent.reply(pb.GenerateMuxEntry(request_id="a", error=err), _chunk("b", 3))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _drain(a)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details() == "needs 9 pages, has 4"
    agent.reply(_chunk("b", 4, reason="length"))
    assert await _drain(b) == [3, 4]
    await pool.close()


async def test_a_broken_stream_fails_every_request_and_the_next_opens_a_new_one() -> None:
    pool, stub = mux.MuxPool(), FakeStub()
    calls = [pool.call("r0", stub, _req(r)) for r in "abc"]
    (agent,) = stub.calls
    agent.reply(_chunk("a", 1))
    agent.fail(mux.rpc_error(grpc.StatusCode.UNAVAILABLE, "Socket closed"))
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _drain(call)
        assert (info.value.code(), info.value.details()) == (
            grpc.StatusCode.UNAVAILABLE,
            "Socket closed",
        )
    d = pool.call("r0", stub, _req("d"))
    assert len(stub.calls) == 2
    stub.calls[1].reply(_chunk("d", 5, reason="stop"))
    assert await _drain(d) == [5]
    await pool.close()


async def test_retired_stream_finishes_its_requests_then_half_closes() -> None:
    pool, stub = mux.MuxPool(), FakeStub()
    a = pool.call("r0", stub, _req("a"))
    pool.drop("r0")  # e.g. the replica was marked failed
    b = pool.call("r0", stub, _req("a"))  # a new stream; the same id is fine there
    old, new = stub.calls
    await _settle()
    assert not old.half_closed.is_set()  # a still runs on it
    old.reply(_chunk("a", 1, reason="length"))
    new.reply(_chunk("a", 2, reason="length"))
    assert await _drain(a) == [1] and await _drain(b) == [2]
    await asyncio.wait_for(old.half_closed.wait(), 5)
    assert not new.half_closed.is_set()
    await pool.close()


async def test_a_duplicate_request_id_on_one_stream_is_renamed() -> None:
    pool, stub = mux.MuxPool(), FakeStub()
    a, b = pool.call("r0", stub, _req("x")), pool.call("r0", stub, _req("x"))
    (agent,) = stub.calls
    await _settle()
    ids = [m.start.request_id for m in agent.sent]
    assert ids[0] == "x" and ids[1] != "x" and b.key == ids[1]
    agent.reply(_chunk(ids[1], 2, reason="stop"), _chunk("x", 1, reason="stop"))
    assert await _drain(a) == [1] and await _drain(b) == [2]
    await pool.close()


async def test_close_fails_running_requests() -> None:
    pool, stub = mux.MuxPool(), FakeStub()
    a = pool.call("r0", stub, _req("a"))
    await pool.close()
    with pytest.raises(grpc.aio.AioRpcError):
        await _drain(a)


async def test_cancel_drops_unread_chunks_like_grpc() -> None:
    pool, stub = mux.MuxPool(), FakeStub()
    a = pool.call("r0", stub, _req("a"))
    (agent,) = stub.calls
    agent.reply(_chunk("a", 1))
    await _settle()  # delivered, not read
    assert a.cancel()
    with pytest.raises(asyncio.CancelledError):
        await anext(a)
    await pool.close()


def test_the_switch_flag_and_environment() -> None:
    import argparse

    from tessera.cli import gateway_cmd

    parser = argparse.ArgumentParser()
    gateway_cmd.register(parser.add_subparsers())
    assert parser.parse_args(["gateway"]).generate_mux is None  # the environment decides
    assert parser.parse_args(["gateway", "--generate-mux"]).generate_mux is True
    assert parser.parse_args(["gateway", "--no-generate-mux"]).generate_mux is False
    assert config.GatewayConfig("m", "/m").generate_mux is True  # the default
    # the entry points (`tessera gateway`, `tessera up`) read the environment
    assert config.generate_mux_from({}) is True
    assert config.generate_mux_from({"TESSERA_GENERATE_MUX": "0"}) is False  # the anchor's
    with pytest.raises(ValueError, match="TESSERA_GENERATE_MUX"):
        config.generate_mux_from({"TESSERA_GENERATE_MUX": "maybe"})


class OldAgentStub(FakeStub):
    """A leader from before GenerateMux (a rolling upgrade): the stream is UNIMPLEMENTED,
    per-request `Generate` calls work."""

    def __init__(self) -> None:
        super().__init__()
        self.generate: list[pb.GenerateRequest] = []
        self.cancelled: list[str] = []

    def GenerateMux(self, requests: AsyncIterator[pb.GenerateMuxRequest]) -> FakeCall:
        call = super().GenerateMux(requests)
        call.fail(mux.rpc_error(grpc.StatusCode.UNIMPLEMENTED, "Method not found!"))
        return call

    def Generate(self, request: pb.GenerateRequest) -> OldCall:
        self.generate.append(request)
        return OldCall(self, request.request_id)


class OldCall:
    def __init__(self, stub: OldAgentStub, rid: str) -> None:
        self._stub, self._rid = stub, rid
        self._chunks = iter(
            [
                pb.GenerateChunk(token_ids=[5]),
                pb.GenerateChunk(token_ids=[6], finish_reason="length"),
            ]
        )

    def __aiter__(self) -> OldCall:
        return self

    async def __anext__(self) -> pb.GenerateChunk:
        await asyncio.sleep(0)
        try:
            return next(self._chunks)
        except StopIteration:
            raise StopAsyncIteration from None

    def cancel(self) -> bool:
        self._stub.cancelled.append(self._rid)
        return True


async def test_a_leader_without_the_stream_gets_per_request_calls() -> None:
    pool, stub = mux.MuxPool(), OldAgentStub()
    a, b = pool.call("r0", stub, _req("a")), pool.call("r0", stub, _req("b"))
    assert await _drain(a) == [5, 6]  # nothing failed: the requests went on as Generate calls
    assert b.cancel() and stub.cancelled == ["b"]  # a cancel reaches the per-request call
    assert [r.request_id for r in stub.generate] == ["a", "b"]
    c = pool.call("r0", stub, _req("c"))  # the replica now takes per-request calls
    assert isinstance(c, OldCall) and len(stub.calls) == 1
    pool.drop("r0")  # a new leader (moved, restarted) is asked for a stream again
    d = pool.call("r0", stub, _req("d"))
    assert isinstance(d, mux.MuxCall) and len(stub.calls) == 2
    assert await _drain(d) == [5, 6]
    await pool.close()
