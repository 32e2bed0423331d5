"""An in-process stand-in for an agent leader, for gateway tests that need requests in flight.

It reports one ready replica and answers `Generate` (and each request started on a
`GenerateMux` stream) with one token after `release` is set, so a test can hold any number
of requests in flight and then let them finish.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc


class FakeLeader(pb_grpc.AgentServicer):  # type: ignore[misc]
    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self.release = asyncio.Event()
        self.started = 0  # Generate calls received

    async def Describe(self, request: Any, context: Any) -> pb.DescribeReply:
        return pb.DescribeReply(agent_id="fake", kv=[pb.ReplicaKV(replica_id=self.replica_id)])

    async def Generate(self, request: Any, context: Any) -> Any:
        self.started += 1
        await self.release.wait()
        yield pb.GenerateChunk(token_ids=[5], finish_reason="length")

    async def GenerateMux(self, request_iterator: Any, context: Any) -> Any:
        out: asyncio.Queue[pb.GenerateMuxReply] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def one(rid: str) -> None:
            self.started += 1
            await self.release.wait()
            chunk = pb.GenerateChunk(token_ids=[5], finish_reason="length")
            out.put_nowait(pb.GenerateMuxReply(entries=[{"request_id": rid, "chunk": chunk}]))

        async def read() -> None:
            async for msg in request_iterator:
                if msg.HasField("start"):
                    tasks.add(asyncio.create_task(one(msg.start.request_id)))

        reader = asyncio.create_task(read())
        try:
            while True:
                yield await out.get()
        finally:
            for t in (reader, *tasks):
                t.cancel()


async def start(replica_id: str = "r0") -> tuple[grpc.aio.Server, FakeLeader, str]:
    srv = transport.server()
    leader = FakeLeader(replica_id)
    pb_grpc.add_AgentServicer_to_server(leader, srv)
    port = transport.add_port(srv, "127.0.0.1:0", tls=None)
    await srv.start()
    return srv, leader, f"127.0.0.1:{port}"
