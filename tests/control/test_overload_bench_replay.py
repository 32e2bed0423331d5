"""`tessera bench overload`'s replay drives the product loop (`control/overload.py`).

The bench's router supplies what a gateway would (its calls per replica, ordered as
`GET /admin/v1/load`; the routes steps) to the tick `tessera up` runs
(`up_overload.UpOverload.tick`); the bench's stats are what those ticks report. Live: two
agent processes, a burst that overfills both pools, the loop drops layers and restores
them, every request completes with transformers' greedy tokens and both replicas are whole
again at the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tessera.cli import bench_overload_replay as replay_mod
from tessera.cli import local_agents
from tessera.control import overload as control
from tessera.control.gateway_load import Call
from tessera.policies.overload import drop_plan
from tessera.policies.overload import held as overload_held
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent.engine import config as config_mod
from tessera_agent.engine import kv_cache
from tests.conftest import hf_greedy

Start = Callable[..., list[local_agents.AgentProcess]]


def _req(i: int, n: int, sent: float, first: float | None, last: float | None) -> Any:
    r = replay_mod.Req(i, [0] * n, 8, sent=sent)
    r.first, r.last = first, last
    return r


def test_router_lists_its_calls_as_the_gateways_load_document() -> None:
    router = replay_mod.Router({"r0": None, "r1": None})  # type: ignore[dict-item]
    router.on["r0"] = [
        _req(0, 5, 1.0, 1.5, 3.0),  # decoding, last token at 3.0
        _req(1, 7, 2.0, None, None),  # waiting since 2.0
        _req(2, 9, 1.2, 1.4, 2.5),  # decoding, last token at 2.5
        _req(3, 3, 0.5, None, None),  # waiting since 0.5
    ]
    got = router.calls()
    assert got["r1"] == ()
    # no token first (longest waiting first), then the longest without a token
    assert got["r0"] == (Call(3, 8, False), Call(7, 8, False), Call(9, 8, True), Call(5, 8, True))


def test_stats_are_what_the_ticks_report() -> None:
    stats = replay_mod.Stats()
    stats.add(
        control.Tick(acted=True, drops=1, exchange_s=0.012, paused_s=0.03, events=[], restores=0)
    )
    warn = control.Event("Warning", drop_plan.REASON_UNREACHABLE, "no grouping frees it")
    stats.add(control.Tick(events=[warn]))
    stats.add(control.Tick(acted=True, restores=1, exchange_s=0.001))
    assert (stats.drops, stats.restores, stats.fallbacks) == (1, 1, 1)
    assert stats.exchange_s == pytest.approx(0.013) and stats.paused_s == pytest.approx(0.03)
    assert stats.events == [
        "OverloadShifted: 1 drops, 0 restores: exchange 12.0 ms, paused 30.0 ms",
        "DropInsufficient: no grouping frees it",
        "OverloadShifted: 0 drops, 1 restores: exchange 1.0 ms, paused 0.0 ms",
    ]


def test_stats_name_the_groups_the_agents_hold_and_those_gone() -> None:
    stage = overload_held.HeldStage
    group = overload_held.HeldGroup(
        "r0",
        (stage("r0", 0, "a0", "x:1", 0, 4, 8, 1, 1), stage("r1", 1, "a1", "x:2", 4, 8, 8, 1, 1)),
    )
    whole = overload_held.Held(whole=("r0", "r1"))
    dropped = overload_held.Held(groups=(group,))
    stats = replay_mod.Stats()
    stats.groups(whole, dropped)
    stats.groups(dropped, dropped)
    stats.groups(dropped, whole)
    assert stats.events == ["OverloadDropped: r0 [0, 4), r1 [4, 8)", "OverloadRestored: r0"]


def _whole(agent: local_agents.AgentProcess) -> list[tuple[str, int, int, int]]:
    ch = transport.sync_channel(agent.address, tls=None)
    try:
        got = pb_grpc.AgentStub(ch).ListBlocks(pb.ListBlocksRequest()).blocks
    finally:
        ch.close()
    return sorted((b.replica_id, b.stage_index, b.layer_start, b.layer_end) for b in got)


@pytest.mark.slow
def test_the_replay_drops_and_restores_through_the_product_loop(
    agents_factory: Start, tiny_llama: Path, prompts: list[list[int]]
) -> None:
    agents = agents_factory(2, devices="cpu:1x256MiB")
    cfg = config_mod.ModelConfig.from_path(tiny_llama)
    per_page = kv_cache.KVLayout(8, 1, 16, cfg.num_kv_heads, cfg.head_dim).bytes_per_page
    for i, a in enumerate(agents):
        local_agents.load_pipeline(
            [a], str(tiny_llama), [(0, 8)], f"r{i}", 8 * per_page, data_plane=False
        )
    chosen = [prompts[i] for i in (1, 3, 0, 4, 7, 5, 2, 1)]
    news = [48] * len(chosen)  # about 20 pages per replica: a queue behind 8-page pools
    rows = [(0.01 * i, len(p), n) for i, (p, n) in enumerate(zip(chosen, news, strict=True))]
    res = asyncio.run(replay_mod.replay(agents, rows, chosen, True, 0.05))
    stats: replay_mod.Stats = res["stats"]
    assert res["lost"] == 0, stats.events
    assert stats.drops >= 1 and stats.restores == stats.drops, stats.events
    assert any(e.startswith("OverloadDropped: ") for e in stats.events), stats.events
    for r, p, n in zip(res["requests"], chosen, news, strict=True):
        assert r.tokens == hf_greedy(tiny_llama, p, n)
    assert [_whole(a) for a in agents] == [[("r0", 0, 0, 8)], [("r1", 0, 0, 8)]]
