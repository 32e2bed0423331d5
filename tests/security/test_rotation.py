"""Certificate rotation without restarts: a server made by `transport` re-reads its files on
the next handshake, so after a Secret update (here: the files rewritten with a new CA and
certificates) new clients of the new CA connect and clients of the old one are refused.
In-process, with the fake leader, no agent processes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import grpc
import pytest

from tessera.policies.security import access
from tessera.rpc import pki, transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tests.gateway.fake_agent import FakeLeader


async def _describe(address: str, files: transport.TlsFiles) -> str:
    channel = transport.channel(address, files)
    try:
        reply = await pb_grpc.AgentStub(channel).Describe(pb.DescribeRequest(), timeout=10)
        return str(reply.agent_id)
    finally:
        await channel.close()


async def test_server_picks_up_rotated_certificates(tmp_path: Path) -> None:
    old = pki.write_deployment(tmp_path / "old", (access.AGENT, access.GATEWAY))
    new = pki.write_deployment(tmp_path / "new", (access.AGENT, access.GATEWAY))
    live = tmp_path / "live"  # what the Secret mount shows the server
    shutil.copytree(old[access.AGENT], live)
    srv = transport.server()
    pb_grpc.add_AgentServicer_to_server(FakeLeader("r0"), srv)
    port = transport.add_port(srv, "127.0.0.1:0", transport.TlsFiles.from_dir(live))
    await srv.start()
    address = f"127.0.0.1:{port}"
    try:
        old_client = transport.TlsFiles.from_dir(old[access.GATEWAY])
        new_client = transport.TlsFiles.from_dir(new[access.GATEWAY])
        assert await _describe(address, old_client) == "fake"
        with pytest.raises(grpc.aio.AioRpcError):
            await _describe(address, new_client)
        for name in ("ca.crt", "tls.crt", "tls.key"):
            shutil.copy(new[access.AGENT] / name, live / name)
            os.utime(live / name, (1, 2))  # a changed mtime, as a Secret update gives
        assert await _describe(address, new_client) == "fake"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _describe(address, old_client)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await srv.stop(None)
