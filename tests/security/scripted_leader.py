"""A scripted in-process agent leader for the hostile-input and stall tests.

It reports one ready replica and answers `Generate` / `GenerateMux` by a `Script`: how many
tokens to stream, how long between them, and whether to wedge (stop sending, forever)
after some tokens or to fail a request whose id ends in a given suffix. It counts calls
started and cancelled, so a test can see that the gateway let go of them.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import grpc

from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

TOKEN = 300  # a plain token of the tiny vocabulary


@dataclass
class Script:
    tokens: int = 0  # 0: the request's max_tokens
    gap_s: float = 0.0  # between two tokens
    wedge_after: int | None = None  # stop sending (forever) after this many tokens
    fail_suffix: str = ""  # a request id ending so fails with UNAVAILABLE at once
    hang_others: bool = False  # requests not failed never send anything


class ScriptedLeader(pb_grpc.AgentServicer):  # type: ignore[misc]
    def __init__(self, replica_id: str, script: Script) -> None:
        self.replica_id = replica_id
        self.script = script
        self.started = 0
        self.cancelled = 0
        self.running = 0

    async def Describe(self, request: Any, context: Any) -> pb.DescribeReply:
        return pb.DescribeReply(
            agent_id="scripted", kv=[pb.ReplicaKV(replica_id=self.replica_id, pages_total=64)]
        )

    async def _chunks(self, req: pb.GenerateRequest) -> Any:
        s = self.script
        if s.fail_suffix and req.request_id.endswith(s.fail_suffix):
            raise RuntimeError("scripted failure")
        if s.hang_others:
            await asyncio.Event().wait()
        n = s.tokens or req.params.max_tokens
        for i in range(n):
            if s.wedge_after is not None and i >= s.wedge_after:
                await asyncio.Event().wait()
            if s.gap_s:
                await asyncio.sleep(s.gap_s)
            yield pb.GenerateChunk(token_ids=[TOKEN], finish_reason="length" if i == n - 1 else "")

    async def Generate(self, request: Any, context: Any) -> Any:
        self.started += 1
        self.running += 1
        try:
            async for chunk in self._chunks(request):
                yield chunk
        except RuntimeError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1

    async def GenerateMux(self, request_iterator: Any, context: Any) -> Any:
        out: asyncio.Queue[pb.GenerateMuxReply] = asyncio.Queue()
        tasks: dict[str, asyncio.Task[None]] = {}

        async def one(req: pb.GenerateRequest) -> None:
            rid = req.request_id
            self.started += 1
            self.running += 1
            try:
                async for chunk in self._chunks(req):
                    out.put_nowait(
                        pb.GenerateMuxReply(entries=[{"request_id": rid, "chunk": chunk}])
                    )
            except RuntimeError as exc:
                err = pb.GenerateMuxError(code="UNAVAILABLE", message=str(exc))
                out.put_nowait(pb.GenerateMuxReply(entries=[{"request_id": rid, "error": err}]))
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            finally:
                self.running -= 1

        async def read() -> None:
            async for msg in request_iterator:
                if msg.HasField("start"):
                    tasks[msg.start.request_id] = asyncio.create_task(one(msg.start))
                elif msg.HasField("cancel"):
                    t = tasks.pop(msg.cancel.request_id, None)
                    if t is not None:
                        t.cancel()

        reader = asyncio.create_task(read())
        try:
            while True:
                yield await out.get()
        finally:
            for t in (reader, *tasks.values()):
                t.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(reader, *tasks.values(), return_exceptions=True)


async def start(replica_id: str, script: Script) -> tuple[grpc.aio.Server, ScriptedLeader, str]:
    srv = transport.server()
    leader = ScriptedLeader(replica_id, script)
    pb_grpc.add_AgentServicer_to_server(leader, srv)
    port = transport.add_port(srv, "127.0.0.1:0", tls=None)
    await srv.start()
    return srv, leader, f"127.0.0.1:{port}"
