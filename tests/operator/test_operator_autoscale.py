"""The operator's replica autoscaler (issue 32): KMock, two agent processes with a host block
cache, a gateway process.

`spec.scaling`: min 0, idle replicas sleep after 1 s. The deployment serves, then both
replicas sleep (`ScaleToZero`, `ReplicaSlept`; `status.autoscaling` lists them; their
blocks stay listed, so no reconcile pass reloads them). A burst of requests arrives while
no replica is awake: the gateway holds them and wakes a replica, every request completes
with transformers' greedy text (none lost), and the loop sees the woken replica. Idle
again, they sleep again; a second burst is served the same way (scale to zero and back,
twice).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes import client
from tokenizers import Tokenizer

from tessera.cli import local_agents
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tests.conftest import hf_greedy
from tests.operator.conftest import create, events, get_sd, wait_for
from tests.operator.test_operator_lifecycle import TWO_REPLICAS, blocks, manifest, ready, refs
from tests.operator.test_operator_overload_loop import Mirror, gateway_process

pytestmark = pytest.mark.slow
_ = gateway_process  # the fixture, imported for this module
PROMPT = [0, 5, 9, 14, 3, 7]
NEW = 6


@pytest.fixture
def cached_agents() -> Iterator[list[local_agents.AgentProcess]]:
    procs = [
        local_agents.start_agent(f"agent-{i}", "cpu:1x512MiB", 1,
                                 extra_args=("--host-cache", "256MiB"))
        for i in range(2)
    ]  # fmt: skip
    yield procs
    for p in procs:
        local_agents.stop_agent(p)


def _sleeping(p: local_agents.AgentProcess) -> list[str]:
    stub = pb_grpc.AgentStub(transport.sync_channel(p.address, tls=None))
    reply = stub.Describe(pb.DescribeRequest(), timeout=5)
    return [k.replica_id for k in reply.kv if k.sleeping]


def _all_asleep(procs: list[local_agents.AgentProcess]) -> bool:
    return len(_sleeping(procs[0]) + _sleeping(procs[1])) == 2


async def _burst(url: str, n: int) -> list[tuple[int, str]]:
    async def one(session: aiohttp.ClientSession) -> tuple[int, str]:
        body = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": NEW,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        async with session.post(url + "/v1/completions", json=body) as r:
            doc: dict[str, Any] = await r.json()
            return r.status, str(doc["choices"][0]["text"]) if r.status == 200 else str(doc)

    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        return list(await asyncio.gather(*(one(session) for _ in range(n))))


def _slept_events(kube: Any) -> bool:
    reasons = [r for r, _ in events(kube, "zero")]
    return "ScaleToZero" in reasons and "ReplicaSlept" in reasons


def _serving(url: str) -> bool:
    try:
        return asyncio.run(_burst(url, 1))[0][0] == 200
    except aiohttp.ClientError:
        return False


def test_scale_to_zero_and_back_twice_and_no_request_lost(
    cached_agents: list[local_agents.AgentProcess],
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
    gateway_process: Callable[..., str],
    tmp_path: Path,
) -> None:
    procs = cached_agents
    tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
    want = tok.decode(hf_greedy(tiny_llama, PROMPT, NEW), skip_special_tokens=True)
    routes = tmp_path / "routes.json"
    routes.write_text('{"replicas": []}')
    url = gateway_process(routes, tiny_llama)
    doc = manifest("zero", tiny_llama, TWO_REPLICAS)
    doc["spec"]["scaling"] = {
        "enabled": True,
        "replicas": {"min": 0},
        "idle": {"sleepAfterSeconds": 1},
        "hold": {"deadlineSeconds": 120},
    }
    start_operator(refs(procs), gateway_admin_url=url, autoscale_tick_seconds=0.3)
    create(kube, doc)
    wait_for("Ready=True", lambda: ready(kube, "zero"), timeout=180)
    mirror = Mirror(kube, "zero", routes)
    wait_for("routes ConfigMap", mirror.sync)
    mirror.start()
    held = sorted(blocks(procs[0]) + blocks(procs[1]))
    try:
        wait_for("the gateway serving", lambda: _serving(url), timeout=60, every=0.5)
        for round_ in range(2):
            wait_for(f"both asleep ({round_})", lambda: _all_asleep(procs), timeout=60, every=0.2)
            # an agent reports a pipelined replica asleep before its peers' stages are
            # (and its `SleepReplica` answers): the tick's events are posted after that
            wait_for(f"the sleep events ({round_})", lambda: _slept_events(kube), timeout=10)
            assert sorted(blocks(procs[0]) + blocks(procs[1])) == held  # asleep, still held
            got = asyncio.run(_burst(url, 4))  # arrives while no replica is awake
            assert got == [(200, want)] * 4, got  # every held request served
            assert len(_sleeping(procs[0]) + _sleeping(procs[1])) < 2  # woken by a request
            wait_for(
                "a wake event",
                lambda: [m for r, m in events(kube, "zero") if r == "ReplicaWoke"],
            )
        st = wait_for(
            "status.autoscaling",
            lambda: (get_sd(kube, "zero") or {}).get("status", {}).get("autoscaling"),
        )
        assert {"awake", "desired", "sleeping", "reason"} <= set(st), st
        sd = get_sd(kube, "zero") or {}
        st = sd.get("status") or {}
        assert ready(kube, "zero") is not None, (st.get("conditions"), st.get("transition"))
    finally:
        mirror.stop()
