"""A tensor-parallel rank killed mid-decode, end to end: gateway in front of real agents.

Two replicas: "tp" shards the whole tiny model over two agent processes (rank 0 on x,
rank 1 on y, gloo group), "solo" runs it on x alone. A long greedy stream starts on "tp";
y is SIGKILLed while it decodes. Rank 0's next all-reduce fails at once, the step ends
UNAVAILABLE, and the gateway continues the request on "solo" from the tokens already
sent: the stream ends normally, in seconds (no hang), with exactly transformers' text,
and the gateway keeps "tp" out of rotation, naming the failed group, while its leader
reports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from tokenizers import Tokenizer

from tessera.bench import client
from tessera.cli import local_agents
from tessera.gateway import config
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tests.agent.test_tp_agents import load_tp
from tests.conftest import hf_greedy
from tests.gateway import helpers

pytestmark = pytest.mark.slow
Start = Callable[..., list[local_agents.AgentProcess]]
C = "/v1/completions"


def _group_state(agent: local_agents.AgentProcess, replica_id: str) -> tuple[str, str]:
    d = pb_grpc.AgentStub(transport.sync_channel(agent.address, tls=None)).Describe(
        pb.DescribeRequest()
    )
    for b in d.blocks:
        if b.replica_id == replica_id and b.stage_index == 0:
            return b.group_state, b.group_reason
    return "", ""


async def test_killed_tp_rank_mid_decode_continues_on_the_other_replica(
    agents_factory: Start, tiny_llama: Path, session: aiohttp.ClientSession
) -> None:
    x, y = agents_factory(2)
    local_agents.load_pipeline([x], str(tiny_llama), [(0, 8)], "solo", 16 << 20)
    load_tp([[x, y]], tiny_llama, [(0, 8)], "tp", timeout_s=10.0)
    ep_tp = config.ReplicaEndpoint("tp", x.address)
    h = await helpers.start(str(tiny_llama), ep_tp, failure_backoff_s=0.0)
    try:
        tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
        text, n = "Once upon a time", 300
        body = {"model": helpers.MODEL, "prompt": text, "max_tokens": n, "temperature": 0}
        resp = await session.post(h.url + C, json={**body, "ignore_eos": True, "stream": True})
        head = [await resp.content.readuntil(b"\n\n") for _ in range(3)]
        assert all(line.startswith(b"data: ") for line in head)
        assert _group_state(x, "tp")[0] == "ready"  # tokens came from the formed group
        h.update_replicas([ep_tp, config.ReplicaEndpoint("solo", x.address)])
        await h.refresh()
        y.proc.kill()  # rank 1 dies mid-decode
        killed = time.monotonic()
        rest = (b"".join(head) + await resp.read()).decode()
        assert time.monotonic() - killed < 30, "the stream hung after a TP rank died"
        assert rest.endswith("data: [DONE]\n\n") and "error" not in rest, rest[-500:]
        events = [ev for ev in client.decode(rest) if ev != client.DONE]
        got = "".join(ev["choices"][0]["text"] for ev in events)
        want = tok.decode(hf_greedy(tiny_llama, tok.encode(text).ids, n), skip_special_tokens=True)
        assert got == want
        retries = await helpers.metric(
            session, h.url, "tessera_gateway_retries_total", replica="tp"
        )
        assert retries >= 1  # the request did move
        state, reason = _group_state(x, "tp")
        assert state == "failed" and "tensor-parallel group failed" in reason
        await h.refresh()  # no backoff: only the leader's report keeps "tp" out
        assert h.ready_replicas() == ["solo"]
        detail = h.service.replicas.states()["tp"].detail
        assert "group failed" in detail, detail
        status, out = await helpers.post(session, h.url + C, {**body, "max_tokens": 8})
        assert status == 200 and out["choices"][0]["text"] == tok.decode(
            hf_greedy(tiny_llama, tok.encode(text).ids, 8), skip_special_tokens=True
        )
    finally:
        await h.stop()
