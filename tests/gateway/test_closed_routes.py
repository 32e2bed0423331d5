"""A full replica the routes close (an overload drop's head) gets no new request while
another ready replica has room, and gets them again once the routes open it (issue 30;
docs/overload.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import grpc

from tessera import routes_doc
from tessera.gateway import routes
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tests.gateway import fake_agent, helpers


class PagedLeader(fake_agent.FakeLeader):
    """A leader whose replica reports 8 KV pages, `used` of them in use."""

    used = 1

    async def Describe(self, request: Any, context: Any) -> pb.DescribeReply:
        kv = pb.ReplicaKV(replica_id=self.replica_id, pages_total=8, pages_used=self.used)
        return pb.DescribeReply(agent_id="fake", kv=[kv])


async def _start(rid: str, used: int) -> tuple[grpc.aio.Server, PagedLeader, str]:
    srv = transport.server()
    leader = PagedLeader(rid)
    leader.used = used
    leader.release.set()
    pb_grpc.add_AgentServicer_to_server(leader, srv)
    port = transport.add_port(srv, "127.0.0.1:0", tls=None)
    await srv.start()
    return srv, leader, f"127.0.0.1:{port}"


async def test_a_closed_replica_takes_new_requests_only_when_reopened(
    tiny_llama: Path, session: aiohttp.ClientSession
) -> None:
    # r0 is a drop's head: full; r1 has room
    (s0, l0, a0), (s1, l1, a1) = await _start("r0", 8), await _start("r1", 1)
    gw = await helpers.start(str(tiny_llama))
    try:

        def doc(closed: bool) -> routes.Routes:
            reps = (routes_doc.RouteReplica("r0", a0, closed), routes_doc.RouteReplica("r1", a1))
            return routes.from_doc(routes_doc.RoutesDoc(reps, version=1))

        assert gw.apply_routes(doc(True))
        await gw.refresh()
        body = {"model": helpers.MODEL, "prompt": "hi", "max_tokens": 1}
        for _ in range(4):
            status, _ = await helpers.post(session, gw.url + "/v1/completions", body)
            assert status == 200
        assert (l0.started, l1.started) == (0, 4)
        assert gw.apply_routes(doc(False))
        for _ in range(4):
            assert (await helpers.post(session, gw.url + "/v1/completions", body))[0] == 200
        assert l0.started > 0  # open again: balanced over both
    finally:
        await gw.stop()
        await s0.stop(None)
        await s1.stop(None)
