"""KV-owner-first dispatch through the gateway, on a real agent process (issue 14).

One agent holds two replicas of the tiny model (whole, one stage each; the block zoo
shares their weights), each with batch limit 2 and the LoRA adapter `legal` attached. A
conversation's second turn goes to the replica that served its first, and that agent's
prefix-cache hits rise. The same prompt under `legal` is not drawn there, because its
prefix was cached under the foundation. Once `legal` has served it, its own next turn
follows it. When the owner's batch is full, the request goes to the other replica. Every
text equals transformers' (+ peft's) greedy tokens.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from tokenizers import Tokenizer

from tessera import blocks, variant_routes
from tessera.cli import local_agents
from tessera.gateway import config, routes, server
from tessera.rpc import blocks as rpc_blocks
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import tiny_variants
from tests.conftest import hf_greedy
from tests.gateway import helpers
from tests.variants.test_variants_gateway import _peft_greedy

pytestmark = pytest.mark.slow
C = "/v1/completions"
REPLICAS = ("r0", "r1")
Counts = dict[tuple[str, str], int]  # (replica, reason) -> routed requests


@pytest.fixture(scope="module")
def legal(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_variants.make_tiny_lora(
        tiny_llama, tmp_path_factory.mktemp("kvd") / "legal", r=4, seed=11
    )


@pytest.fixture(scope="module")
def agent(tiny_llama: Path, legal: Path) -> Iterator[local_agents.AgentProcess]:
    a = local_agents.start_agent("kvd-0", "cpu:1x512MiB", 1)
    try:
        stub = pb_grpc.AgentStub(transport.sync_channel(a.address, tls=None))
        for rid in REPLICAS:
            b = blocks.Block(str(tiny_llama), 0, 8, replica_id=rid, kv_bytes=8 << 20)
            stub.LoadBlock(rpc_blocks.load_request(b, max_num_seqs=2), timeout=120)
            stub.VariantAdapters(
                pb.VariantAdaptersRequest(
                    replica_id=rid,
                    stage_index=0,
                    adapters=[pb.VariantAdapter(name="legal", path=str(legal))],
                ),
                timeout=60,
            )
        yield a
    finally:
        local_agents.stop_agent(a)


def _hits(a: local_agents.AgentProcess) -> dict[str, int]:
    channel = transport.sync_channel(a.address, tls=None)
    try:
        reply = pb_grpc.AgentStub(channel).Describe(pb.DescribeRequest(), timeout=10)
    finally:
        channel.close()
    return {kv.replica_id: int(kv.prefix_hit_tokens) for kv in reply.kv}


async def _routed(s: aiohttp.ClientSession, gw: server.GatewayHandle) -> Counts:
    name = "tessera_gateway_routed_requests_total"
    reasons = ("kv_owner", "owner_full", "lowest_latency")
    return {
        (rid, why): int(await helpers.metric(s, gw.url, name, replica=rid, policy=why))
        for rid in REPLICAS
        for why in reasons
    }


def _new(before: Counts, after: Counts) -> set[tuple[str, str]]:
    return {k for k in after if after[k] > before[k]}


async def test_turns_follow_their_kv_per_variant_and_a_full_owner_spills(
    agent: local_agents.AgentProcess, tiny_llama: Path, legal: Path
) -> None:
    tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
    gw = await helpers.start(str(tiny_llama))
    try:
        gw.apply_routes(
            routes.Routes(
                replicas=tuple(config.ReplicaEndpoint(r, agent.address) for r in REPLICAS),
                variants=(variant_routes.RouteVariant("legal", "lora"),),
            )
        )
        await gw.refresh()
        assert sorted(gw.ready_replicas()) == list(REPLICAS)
        async with aiohttp.ClientSession() as s:

            async def ask(prompt: list[int], n: int, model: str = helpers.MODEL) -> str:
                body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0}
                status, out = await helpers.post(s, gw.url + C, {**body, "ignore_eos": True})
                assert status == 200, out
                return str(out["choices"][0]["text"])

            def text(ids: list[int]) -> str:
                return str(tok.decode(ids, skip_special_tokens=True))

            # turn 1: no owner anywhere
            turn1 = [0, *range(200, 250)]
            answer = hf_greedy(tiny_llama, turn1, 8)
            r0 = await _routed(s, gw)
            assert await ask(turn1, 8) == text(answer)
            r1 = await _routed(s, gw)
            ((owner, why),) = _new(r0, r1)
            assert why == "lowest_latency"
            other = next(r for r in REPLICAS if r != owner)

            # turn 2: prompt = turn 1 + its answer + the next message -> the owner, cache hit
            turn2 = [*turn1, *answer, 5, 6, 7]
            hits = _hits(agent)
            assert await ask(turn2, 8) == text(hf_greedy(tiny_llama, turn2, 8))
            r2 = await _routed(s, gw)
            assert _new(r1, r2) == {(owner, "kv_owner")}
            after = _hits(agent)
            assert after[owner] - hits[owner] >= 48  # 3 full pages of 16 came from the cache

            # the same prompt under `legal`: its prefix is cached under the foundation only
            want = _peft_greedy(str(tiny_llama), str(legal), tuple(turn2), 8)
            assert await ask(turn2, 8, "legal") == text(want)
            r3 = await _routed(s, gw)
            assert _new(r2, r3) == {(other, "lowest_latency")}  # not drawn to the owner
            assert _hits(agent) == after  # and no page crossed the variants
            # ... and `legal`'s own next turn follows its own KV
            turn3 = [*turn2, *want, 9, 10]
            want3 = _peft_greedy(str(tiny_llama), str(legal), tuple(turn3), 4)
            assert await ask(turn3, 4, "legal") == text(want3)
            r4 = await _routed(s, gw)
            assert _new(r3, r4) == {(other, "kv_owner")}
            assert _hits(agent)[other] - after[other] >= 48

            # the owner's batch full (2 long requests there): the next turn goes elsewhere
            longs = [[*turn2, *answer[:2], k] for k in (11, 12)]
            running = [asyncio.create_task(ask(p, 200)) for p in longs]
            deadline = time.monotonic() + 60
            while len(gw.in_flight(owner)) < 2:
                assert time.monotonic() < deadline, "the long requests never ran together"
                assert not any(t.done() for t in running)
                await asyncio.sleep(0.005)
            spill = [*turn2, 13]
            assert await ask(spill, 4) == text(hf_greedy(tiny_llama, spill, 4))
            texts = await asyncio.gather(*running)
            r5 = await _routed(s, gw)
            assert r5[(owner, "kv_owner")] - r4[(owner, "kv_owner")] == 2
            assert r5[(other, "owner_full")] - r4[(other, "owner_full")] == 1
            for p, got in zip(longs, texts, strict=True):
                assert got == text(hf_greedy(tiny_llama, p, 200))
            decisions = "tessera_gateway_dispatch_decisions_total"
            assert await helpers.metric(s, gw.url, decisions, reason="kv_owner") == 4
            assert await helpers.metric(s, gw.url, decisions, reason="owner_full") == 1
    finally:
        await gw.stop()
