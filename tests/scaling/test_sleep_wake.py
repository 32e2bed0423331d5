"""Sleep and wake on real agents (issue 32, `tessera_agent.sleep`): SleepReplica moves a
replica's blocks to the host cache and frees its device memory, Describe still lists the
blocks and marks the replica sleeping, WakeReplica restores from the host cache (no storage
read) and serves transformers' greedy tokens, a Generate for a sleeper wakes it first,
asking the leader sleeps and wakes a two-agent pipeline, and an unload of a sleeper only
forgets it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tessera.cli import local_agents
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import devices, load_config, servicer
from tests.conftest import hf_greedy

MiB = 1 << 20
PROMPT = [3, 1, 4, 1]


async def _agent(name: str) -> tuple[Any, servicer.AgentServicer, str]:
    devs, nvml = devices.parse_devices("cpu:1x512MiB")
    defaults = load_config.LoadDefaults(host_cache_bytes=128 * MiB)
    svc = servicer.AgentServicer(name, devs, nvml, "test", defaults=defaults)
    srv = transport.server()
    pb_grpc.add_AgentServicer_to_server(svc, srv)
    port = transport.add_port(srv, "127.0.0.1:0", None)
    await srv.start()
    return srv, svc, f"127.0.0.1:{port}"


@pytest.fixture
async def two(tiny_llama: Path) -> AsyncIterator[list[tuple[Any, servicer.AgentServicer, str]]]:
    started = [await _agent("sw-0"), await _agent("sw-1")]
    yield started
    for srv, svc, _ in started:
        await svc.close()
        await srv.stop(None)


async def _load(agents: list[tuple[Any, Any, str]], model: Path, splits: list[Any]) -> None:
    procs = [
        local_agents.AgentProcess(f"sw-{i}", None, a)  # type: ignore[arg-type]
        for i, (_, _, a) in enumerate(agents)
    ]
    await asyncio.to_thread(
        local_agents.load_pipeline, procs, str(model), splits, "r0", data_plane=False
    )


async def _generate(stub: Any, rid: str) -> list[int]:
    req = pb.GenerateRequest(
        replica_id="r0",
        request_id=rid,
        prompt_token_ids=PROMPT,
        params=pb.SamplingParams(max_tokens=5, ignore_eos=True),
    )
    return [t async for c in stub.Generate(req) for t in c.token_ids]


async def test_sleep_wake_and_a_request_that_wakes_one_agent(
    tiny_llama: Path, two: list[tuple[Any, servicer.AgentServicer, str]]
) -> None:
    _, svc, address = two[0]
    await _load(two[:1], tiny_llama, [(0, 8)])
    want = hf_greedy(tiny_llama, PROMPT, 5)
    async with transport.channel(address, tls=None) as ch:
        stub = pb_grpc.AgentStub(ch)
        assert await _generate(stub, "a") == want
        dev = svc.memory.devices["cpu:0"]
        slept = await stub.SleepReplica(pb.SleepReplicaRequest(replica_id="r0"))
        assert slept.sleeping and slept.offloaded_bytes > 0 and slept.released_kv_bytes > 0
        assert dev.free_bytes == dev.capacity_bytes  # the device holds nothing of it
        desc = await stub.Describe(pb.DescribeRequest())
        assert [(k.replica_id, k.sleeping) for k in desc.kv] == [("r0", True)]
        assert [b.replica_id for b in desc.blocks] == ["r0"]  # still held: no drift
        again = await stub.SleepReplica(pb.SleepReplicaRequest(replica_id="r0"))
        assert again.offloaded_bytes == 0  # idempotent
        woke = await stub.WakeReplica(pb.WakeReplicaRequest(replica_id="r0"))
        assert woke.awake and woke.restored_bytes == slept.offloaded_bytes
        desc = await stub.Describe(pb.DescribeRequest())
        assert [(k.replica_id, k.sleeping) for k in desc.kv] == [("r0", False)]
        assert desc.blocks[0].load.host_bytes > 0 and desc.blocks[0].load.storage_bytes == 0
        assert await _generate(stub, "b") == want
        await stub.SleepReplica(pb.SleepReplicaRequest(replica_id="r0"))
        assert await _generate(stub, "c") == want  # a request for a sleeper wakes it
        assert svc.sleepers.asleep == {}
        await stub.SleepReplica(pb.SleepReplicaRequest(replica_id="r0"))
        await stub.UnloadBlock(pb.UnloadBlockRequest(replica_id="r0", stage_index=0))
        desc = await stub.Describe(pb.DescribeRequest())
        assert not desc.blocks and not desc.kv  # an unloaded sleeper is gone


async def test_the_leader_sleeps_and_wakes_a_two_agent_pipeline(
    tiny_llama: Path, two: list[tuple[Any, servicer.AgentServicer, str]]
) -> None:
    await _load(two, tiny_llama, [(0, 4), (4, 8)])
    want = hf_greedy(tiny_llama, PROMPT, 5)
    async with transport.channel(two[0][2], tls=None) as ch:
        stub = pb_grpc.AgentStub(ch)
        assert await _generate(stub, "a") == want
        await stub.SleepReplica(pb.SleepReplicaRequest(replica_id="r0"))
        assert two[0][1].sleepers.asleep.keys() == two[1][1].sleepers.asleep.keys() == {"r0"}
        woke = await stub.WakeReplica(pb.WakeReplicaRequest(replica_id="r0"))
        assert woke.awake and not two[1][1].sleepers.asleep
        assert await _generate(stub, "b") == want
