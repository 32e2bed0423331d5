"""KunServe drop and restore on live local agents, mid-decode (issue 13's acceptance).

Two agent processes each serve a whole replica of the tiny Llama with a 16-page KV pool.
Five requests on the head replica fill its pool with a queue behind them. The drop plan
(`policies.drop_plan`) groups the two replicas; the driver performs
`policies.overload_steps.drop_steps` over the agents' RPCs while requests decode: the
donor becomes stage 1 (layers 4-7) of the head's replica, the head keeps layers 0-3, the
running requests' K/V for layers 4-7 is exchanged in chunks, both pools grow by exactly
the freed bytes, and the queue starts. Once the held pages fit the whole-model pool again
(a request still decoding), `restore_steps` returns both to whole replicas. Every
request's greedy tokens equal transformers', the pools are what the accounting says, and
the donor serves again on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from tessera.cli import local_agents
from tessera.control import overload_driver
from tessera.policies.overload import drop_plan
from tessera.policies.overload import steps as overload_steps
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent.engine import config as config_mod
from tessera_agent.engine import kv_cache
from tests.conftest import hf_greedy

pytestmark = pytest.mark.slow
Start = Callable[..., list[local_agents.AgentProcess]]
PAGES = 16
PAGE = 16


def _blocks(agent: local_agents.AgentProcess) -> dict[tuple[str, int], pb.BlockInfo]:
    ch = transport.sync_channel(agent.address, tls=None)
    try:
        got = pb_grpc.AgentStub(ch).ListBlocks(pb.ListBlocksRequest()).blocks
    finally:
        ch.close()
    return {(b.replica_id, b.stage_index): b for b in got}


def test_drop_and_restore_mid_decode_on_local_agents(
    agents_factory: Start, tiny_llama: Path, prompts: list[list[int]]
) -> None:
    a, b = agents_factory(2, devices="cpu:1x256MiB")
    cfg = config_mod.ModelConfig.from_path(tiny_llama)
    per_page = kv_cache.KVLayout(8, 1, PAGE, cfg.num_kv_heads, cfg.head_dim).bytes_per_page
    half_page = per_page // 2
    for agent, rid in ((a, "ra"), (b, "rb")):
        local_agents.load_pipeline(
            [agent], str(tiny_llama), [(0, 8)], rid, PAGES * per_page, data_plane=False
        )
    before = {**_blocks(a), **_blocks(b)}
    assert before[("ra", 0)].kv_pages == before[("rb", 0)].kv_pages == PAGES
    budget = before[("ra", 0)].param_bytes + before[("ra", 0)].kv_bytes

    chosen = [prompts[i] for i in (1, 3, 0, 4, 7)]  # 18, 41, 4, 10, 24 tokens
    news = [40, 40, 40, 40, 120]  # 25 pages in all: a queue behind a full 16-page pool
    wants = [hf_greedy(tiny_llama, p, n) for p, n in zip(chosen, news, strict=True)]
    members = {
        "ra": overload_steps.Member("ra", a.address),
        "rb": overload_steps.Member("rb", b.address),
    }
    layer_bytes = (before[("ra", 0)].param_bytes // 8,) * 8
    plan = drop_plan.plan_drop(
        drop_plan.DropInput(
            (
                drop_plan.Replica("ra", frozenset(range(8))),
                drop_plan.Replica("rb", frozenset(range(8))),
            ),
            layer_bytes,
            required_bytes=9 * per_page,
        )
    )
    assert not plan.fallback and len(plan.groups) == 1
    group = plan.groups[0]
    assert [(s.replica, s.start, s.end) for s in group.stages] == [("ra", 0, 4), ("rb", 4, 8)]
    seen: dict[str, object] = {}

    async def main() -> list[list[int]]:
        ch = transport.channel(a.address, tls=None)
        stub = pb_grpc.AgentStub(ch)
        outs: list[list[int]] = [[] for _ in chosen]

        async def one(i: int) -> None:
            params = pb.SamplingParams(max_tokens=news[i], ignore_eos=True)
            req = pb.GenerateRequest(replica_id="ra", prompt_token_ids=chosen[i], params=params)
            async for chunk in stub.Generate(req, timeout=600):
                outs[i].extend(chunk.token_ids)

        async def kv() -> pb.ReplicaKV:
            desc = await stub.Describe(pb.DescribeRequest(), timeout=10)
            return next(k for k in desc.kv if k.replica_id == "ra")

        async def control() -> None:
            driver = overload_driver.Driver(chunk_pages=3, tls=None)
            while not (any(outs) and (await kv()).waiting):
                await asyncio.sleep(0.01)
            seen["at_drop"] = await kv()
            seen["drop"] = await driver.run(overload_steps.drop_steps(group, members))
            seen["dropped"] = {**_blocks(a), **_blocks(b)}
            seen["after_drop"] = await kv()
            while True:  # restore once the held pages fit the whole-model pool
                k = await kv()
                if not k.waiting and k.pages_used <= PAGES:
                    break
                await asyncio.sleep(0.01)
            seen["at_restore"] = [len(o) for o in outs]
            seen["restore"] = await driver.run(overload_steps.restore_steps(group, members, 8))
            await driver.close()

        await asyncio.gather(control(), *(one(i) for i in range(len(chosen))))
        await ch.close()
        return outs

    outs = asyncio.run(main())
    assert outs == wants  # every request completed, with transformers' greedy tokens

    at_drop = seen["at_drop"]
    assert isinstance(at_drop, pb.ReplicaKV) and at_drop.waiting and at_drop.running
    # the drop: pools grew in place by exactly the freed bytes, within the device budget
    dropped = seen["dropped"]
    assert isinstance(dropped, dict)
    head, tail = dropped[("ra", 0)], dropped[("ra", 1)]
    assert ("rb", 0) not in dropped  # the donor's block is now stage 1 of the head's replica
    assert (head.layer_start, head.layer_end, tail.layer_start, tail.layer_end) == (0, 4, 4, 8)
    for blk in (head, tail):
        freed = budget - PAGES * per_page - blk.param_bytes
        assert blk.kv_pages == (PAGES * per_page + freed) // half_page > 2 * PAGES
        assert blk.param_bytes + blk.kv_bytes <= budget
    after = seen["after_drop"]
    assert isinstance(after, pb.ReplicaKV)
    assert after.pages_total == min(head.kv_pages, tail.kv_pages)
    rep = seen["drop"]
    assert isinstance(rep, overload_driver.Report)
    # held and prefix-cached pages (a preempted request re-admitted reuses its cached pages)
    assert rep.exchanged_pages >= at_drop.pages_used and rep.exchange_chunks >= 2
    # the restore happened mid-decode: some request was still generating
    at_restore = seen["at_restore"]
    assert isinstance(at_restore, list)
    assert any(0 < n < m for n, m in zip(at_restore, news, strict=True))
    restored = {**_blocks(a), **_blocks(b)}
    assert set(restored) == {("ra", 0), ("rb", 0)}
    for blk in restored.values():
        assert (blk.layer_start, blk.layer_end, blk.num_stages) == (0, 8, 1)
        assert blk.kv_pages == PAGES and blk.param_bytes + blk.kv_bytes == budget
    # the donor is its own replica again
    tokens = local_agents.generate_tokens(
        pb_grpc.AgentStub(transport.sync_channel(b.address, tls=None)), "rb", chosen[1], 8
    )
    assert tokens == wants[1][:8]
