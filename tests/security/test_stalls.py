"""Peers that stall: a wedged replica, slow request bodies, clients that never read, and
a failing choice among `n`. Each ends within its time limit and frees what it held."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import aiohttp
import pytest

from tessera.gateway import config, limits
from tests.gateway import helpers
from tests.security import scripted_leader as sl

M = helpers.MODEL


@pytest.mark.parametrize("mux", [False, True], ids=["generate", "mux"])
async def test_wedged_replica_requests_finish_elsewhere_within_the_token_timeout(
    tiny_llama: Path, session: aiohttp.ClientSession, mux: bool
) -> None:
    wedged = await sl.start("r0", sl.Script(wedge_after=2))
    healthy = await sl.start("r1", sl.Script())
    timeout = 0.5
    gw = await helpers.start(
        str(tiny_llama),
        config.ReplicaEndpoint("r0", wedged[2]),
        config.ReplicaEndpoint("r1", healthy[2]),
        limits=limits.Limits(token_timeout_s=timeout),
        generate_mux=mux,
        failure_backoff_s=30.0,
    )
    try:
        body = {"model": M, "prompt": "Once upon", "max_tokens": 6, "temperature": 0}
        began = time.monotonic()
        got = await asyncio.gather(*(helpers.post(session, gw.url + "/v1/completions", body)
                                     for _ in range(4)))  # fmt: skip
        took = time.monotonic() - began
        for status, reply in got:
            assert status == 200, reply
            assert reply["usage"]["completion_tokens"] == 6
        assert wedged[1].started >= 1  # some started on the wedged replica
        assert took < timeout + 2.0, took
        state = gw.service.replicas.states()["r0"]
        assert not state.ready and "no token" in state.detail
        assert gw.service.dispatcher._router.outstanding("r0") == 0
    finally:
        await gw.stop()
        for srv, _, _ in (wedged, healthy):
            await srv.stop(None)


async def test_n_choices_cancel_their_siblings_when_one_fails(
    tiny_llama: Path, session: aiohttp.ClientSession
) -> None:
    srv, leader, address = await sl.start("r0", sl.Script(fail_suffix=".c2", hang_others=True))
    gw = await helpers.start(
        str(tiny_llama), config.ReplicaEndpoint("r0", address), generate_mux=False
    )
    try:
        body = {"model": M, "prompt": "Once upon", "max_tokens": 4, "n": 3}
        status, reply = await asyncio.wait_for(
            helpers.post(session, gw.url + "/v1/completions", body), 10
        )
        assert status == 503, reply
        for _ in range(50):
            if leader.running == 0:
                break
            await asyncio.sleep(0.05)
        assert leader.running == 0 and leader.cancelled == 2
        assert gw.service.dispatcher._router.outstanding("r0") == 0
    finally:
        await gw.stop()
        await srv.stop(None)


async def _slow_body(url: str, pause_s: float) -> bytes:
    """Send headers and half a body, then stall; return what the gateway answered."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps({"model": M, "prompt": "x"}).encode()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body[:5]
    )
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(4096), pause_s)
    finally:
        writer.close()


async def test_slow_bodies_time_out_without_holding_admission(
    tiny_llama: Path, session: aiohttp.ClientSession
) -> None:
    srv, _, address = await sl.start("r0", sl.Script())
    lim = limits.Limits(body_timeout_s=0.5, max_in_flight_per_replica=2)
    gw = await helpers.start(str(tiny_llama), config.ReplicaEndpoint("r0", address), limits=lim)
    try:
        stalled = [asyncio.create_task(_slow_body(gw.url, 5.0)) for _ in range(10)]
        await asyncio.sleep(0.2)
        # ten half-sent bodies hold no admission slot: a normal request is served (not 429)
        body = {"model": M, "prompt": "Once upon", "max_tokens": 2}
        status, reply = await helpers.post(session, gw.url + "/v1/completions", body)
        assert status == 200, reply
        answers = await asyncio.gather(*stalled)
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers[0][:200]
    finally:
        await gw.stop()
        await srv.stop(None)


async def test_slow_bodies_cannot_hold_more_than_the_byte_budget(
    tiny_llama: Path, session: aiohttp.ClientSession
) -> None:
    srv, _, address = await sl.start("r0", sl.Script())
    size = len(json.dumps({"model": M, "prompt": "x"}))
    lim = limits.Limits(body_timeout_s=1.0, body_bytes_in_flight=5 * size)
    gw = await helpers.start(str(tiny_llama), config.ReplicaEndpoint("r0", address), limits=lim)
    try:
        stalled = [asyncio.create_task(_slow_body(gw.url, 5.0)) for _ in range(8)]
        answers = await asyncio.gather(*stalled)
        codes = sorted(a[9:12] for a in answers)
        assert codes == [b"408"] * 5 + [b"429"] * 3, answers
        body = {"model": M, "prompt": "Once upon", "max_tokens": 2}
        status, reply = await helpers.post(session, gw.url + "/v1/completions", body)
        assert status == 200, reply  # the budget was given back
    finally:
        await gw.stop()
        await srv.stop(None)


async def test_a_client_that_never_reads_a_stream_is_dropped(tiny_llama: Path) -> None:
    srv, leader, address = await sl.start("r0", sl.Script(gap_s=0.01))
    lim = limits.Limits(write_timeout_s=0.5, max_tokens=0)
    gw = await helpers.start(str(tiny_llama), config.ReplicaEndpoint("r0", address), limits=lim)
    try:
        host, port = gw.url.removeprefix("http://").split(":")
        _reader, writer = await asyncio.open_connection(host, int(port))
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        body = json.dumps(
            {"model": M, "prompt": ["x"] * 16, "n": 16, "max_tokens": 1000, "stream": True}
        ).encode()
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        # never read: the gateway's writes block, then it gives up and frees the request
        router = gw.service.dispatcher._router
        for _ in range(100):
            await asyncio.sleep(0.1)
            if leader.started and router.outstanding("r0") == 0:
                break
        assert leader.started == 256 and router.outstanding("r0") == 0
        assert leader.cancelled > 0  # agent calls were cancelled, not run to their end
        async with aiohttp.ClientSession() as s:
            dropped = await helpers.metric(
                s, gw.url, "tessera_gateway_requests_total", status="499"
            )
        assert dropped == 1
        writer.close()
    finally:
        await gw.stop()
        await srv.stop(None)
