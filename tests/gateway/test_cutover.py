"""The gateway's versioned cut-over in front of real agents: new requests go to the new
version at once; a request decoding on a replica that leaves either finishes there (drain)
or has its KV moved to a survivor and continues there (move); greedy text stays exactly
transformers'; `GET /admin/v1/routes` shows the leaving replica until it is idle."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from tokenizers import Tokenizer

from tessera.bench import client
from tessera.cli import local_agents
from tessera.gateway import config, routes, server
from tessera.rpc.v1 import agent_pb2 as pb
from tests.agent.test_agent_rpc import _stub, load_replica
from tests.conftest import hf_greedy
from tests.gateway import helpers

pytestmark = pytest.mark.slow
C = "/v1/completions"
PROMPT = [0, *range(300, 340)]  # 41 tokens


@pytest.fixture(scope="module")
def cluster(tiny_llama: Path) -> Iterator[list[local_agents.AgentProcess]]:
    """a0 serves "old" (all 8 layers); a1 → a2 serve "new" (layers 0-3, 3-8)."""
    agents: list[local_agents.AgentProcess] = []
    try:
        for i in range(3):
            agents.append(local_agents.start_agent(f"cut-{i}", "cpu:1x512MiB", 1))
        load_replica(agents[:1], tiny_llama, [(0, 8)], "old")
        load_replica(agents[1:], tiny_llama, [(0, 3), (3, 8)], "new")
        yield agents
    finally:
        for a in agents:
            local_agents.stop_agent(a)


def _routes(version: int, deadline: float, *eps: config.ReplicaEndpoint) -> routes.Routes:
    return routes.Routes(replicas=eps, version=version, drain_deadline_s=deadline)


@pytest.fixture
async def gw(
    cluster: list[local_agents.AgentProcess], tiny_llama: Path
) -> AsyncIterator[server.GatewayHandle]:
    h = await helpers.start(str(tiny_llama), poll_interval_s=0.1)
    assert h.apply_routes(_routes(1, 30.0, config.ReplicaEndpoint("old", cluster[0].address)))
    await h.refresh()
    assert h.ready_replicas() == ["old"]
    yield h
    await h.stop()


async def _poll(cond: Callable[[], Any], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def _admin(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url + "/admin/v1/routes") as r:
        assert r.status == 200
        body: dict[str, Any] = await r.json()
        return body


async def _stream_until(
    session: aiohttp.ClientSession, url: str, max_tokens: int, started: asyncio.Event
) -> str:
    """Stream a greedy completion; set `started` after the first few text events."""
    body = {
        "model": helpers.MODEL,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    text, events = [], 0
    async with session.post(url + C, json=body) as r:
        assert r.status == 200, await r.text()
        async for ev in client.events(r.content):
            if ev == client.DONE:
                continue
            assert "error" not in ev, ev
            text.extend(ch["text"] for ch in ev["choices"])
            events += 1
            if events == 4:
                started.set()
    return "".join(text)


async def test_request_removed_mid_decode_moves_its_kv_and_continues(
    gw: server.GatewayHandle,
    cluster: list[local_agents.AgentProcess],
    tiny_llama: Path,
    session: aiohttp.ClientSession,
) -> None:
    tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
    n = 200
    want = tok.decode(hf_greedy(tiny_llama, PROMPT, n), skip_special_tokens=True)
    started = asyncio.Event()
    req = asyncio.create_task(_stream_until(session, gw.url, n, started))
    await asyncio.wait_for(started.wait(), 120)
    hits_before = _hits(cluster[1], "new")
    # deadline 0: the running request cannot drain, it must move
    assert gw.apply_routes(_routes(2, 0.0, config.ReplicaEndpoint("new", cluster[1].address)))
    snap = await _admin(session, gw.url)
    assert snap["version"] == 2 and snap["replicas"] == ["new"]
    assert snap["leaving"] in ({"old": 1}, {})
    got = await asyncio.wait_for(req, 300)
    assert got == want  # transformers' greedy text, across the move
    assert (
        await helpers.metric(
            session, gw.url, "tessera_gateway_cutover_requests_total", outcome="moved"
        )
        == 1
    )
    # a redirect, not a failure: no retry counted, the old replica not marked failed
    assert await helpers.metric(session, gw.url, "tessera_gateway_retries_total") == 0
    # the moved KV was used, not recomputed: at least the prompt's 2 full pages
    assert _hits(cluster[1], "new") - hits_before >= 32

    async def left() -> bool:
        return (await _admin(session, gw.url))["leaving"] == {}

    await _poll(left)
    # the old replica holds no request any more; the new one serves new requests
    assert _running(cluster[0], "old") == 0
    status, _ = await helpers.post(
        session,
        gw.url + C,
        {"model": helpers.MODEL, "prompt": PROMPT, "max_tokens": 3, "temperature": 0},
    )
    assert status == 200
    assert (
        await helpers.metric(
            session, gw.url, "tessera_gateway_routed_requests_total", replica="new"
        )
        >= 2
    )


async def test_short_request_drains_on_the_leaving_replica(
    gw: server.GatewayHandle,
    cluster: list[local_agents.AgentProcess],
    tiny_llama: Path,
    session: aiohttp.ClientSession,
) -> None:
    tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
    n = 40
    want = tok.decode(hf_greedy(tiny_llama, PROMPT, n), skip_special_tokens=True)
    started = asyncio.Event()
    req = asyncio.create_task(_stream_until(session, gw.url, n, started))
    await asyncio.wait_for(started.wait(), 120)
    assert gw.apply_routes(_routes(2, 120.0, config.ReplicaEndpoint("new", cluster[1].address)))
    assert await asyncio.wait_for(req, 300) == want

    async def left() -> bool:
        return (await _admin(session, gw.url))["leaving"] == {}

    await _poll(left)
    assert (
        await helpers.metric(
            session, gw.url, "tessera_gateway_cutover_requests_total", outcome="drained"
        )
        == 1
    )
    assert (
        await helpers.metric(
            session, gw.url, "tessera_gateway_cutover_requests_total", outcome="moved"
        )
        == 0
    )
    # a stale version is ignored: the gateway keeps serving version 2
    assert not gw.apply_routes(_routes(1, 1.0, config.ReplicaEndpoint("old", cluster[0].address)))
    assert (await _admin(session, gw.url))["replicas"] == ["new"]


def _kv(agent: local_agents.AgentProcess, replica_id: str) -> pb.ReplicaKV:
    kv = _stub(agent).Describe(pb.DescribeRequest()).kv
    return next(k for k in kv if k.replica_id == replica_id)


def _hits(agent: local_agents.AgentProcess, replica_id: str) -> int:
    return int(_kv(agent, replica_id).prefix_hit_tokens)


def _running(agent: local_agents.AgentProcess, replica_id: str) -> int:
    k = _kv(agent, replica_id)
    return int(k.running + k.waiting)
