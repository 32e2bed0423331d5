"""The multiplexed token stream live: when the leader agent itself dies, its GenerateMux
stream breaks and every request on it continues on another replica, losing nothing (the
greedy text still equals transformers'); the old per-request path still serves when the
switch is off."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from tokenizers import Tokenizer

from tessera.bench import client
from tessera.cli import local_agents
from tessera.gateway import config
from tests.agent.test_agent_rpc import load_replica
from tests.conftest import hf_greedy
from tests.gateway import helpers

pytestmark = pytest.mark.slow
Start = Callable[..., list[local_agents.AgentProcess]]
C = "/v1/completions"


async def _stream_text(resp: aiohttp.ClientResponse, head: list[bytes]) -> str:
    rest = (b"".join(head) + await resp.read()).decode()
    assert rest.endswith("data: [DONE]\n\n") and "error" not in rest, rest[-300:]
    return "".join(ev["choices"][0]["text"] for ev in client.decode(rest) if ev != client.DONE)


async def test_leader_death_breaks_the_stream_and_every_request_continues(
    agents_factory: Start, tiny_llama: Path, session: aiohttp.ClientSession
) -> None:
    w, x = agents_factory(2)
    load_replica([w], tiny_llama, [(0, 8)], "w")
    load_replica([x], tiny_llama, [(0, 8)], "x")
    ep_w, ep_x = config.ReplicaEndpoint("w", w.address), config.ReplicaEndpoint("x", x.address)
    h = await helpers.start(str(tiny_llama), ep_w, failure_backoff_s=0.0, generate_mux=True)
    tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
    try:
        assert h.service.replicas.mux is not None  # the multiplexed path
        texts, n = ["Once upon a time", "The quick brown fox"], 120
        body = {"model": helpers.MODEL, "max_tokens": n, "temperature": 0, "ignore_eos": True}
        resps = [
            await session.post(h.url + C, json={**body, "prompt": t, "stream": True}) for t in texts
        ]
        heads = [[await r.content.readuntil(b"\n\n") for _ in range(3)] for r in resps]
        assert h.service.replicas.mux.running("w") == 2  # both on w's one stream
        h.update_replicas([ep_w, ep_x])
        await h.refresh()
        w.proc.kill()  # the leader: its stream breaks under both requests
        w.proc.wait()
        got = await asyncio.gather(
            *(_stream_text(r, hd) for r, hd in zip(resps, heads, strict=True))
        )
        want = [
            str(tok.decode(hf_greedy(tiny_llama, tok.encode(t).ids, n), skip_special_tokens=True))
            for t in texts
        ]
        assert got == want
        retries = await helpers.metric(session, h.url, "tessera_gateway_retries_total", replica="w")
        assert retries == 2
    finally:
        await h.stop()
    # the per-request path (switch off) on the surviving replica
    h = await helpers.start(str(tiny_llama), ep_x, generate_mux=False)
    try:
        assert h.service.replicas.mux is None
        events = await helpers.post_stream(session, h.url + C, {**body, "prompt": texts[0]})
        assert helpers.streamed_text(events) == want[0]
    finally:
        await h.stop()
