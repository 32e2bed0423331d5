"""Requests held while no replica is awake (issue 32, `hold.py`): a held request completes
once a sleeping replica wakes or a replica appears, a deadline gives 503 with Retry-After,
a full hold queue gives 503 at once, and none of many held requests is lost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tessera.gateway import config, errors, hold
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tests.gateway import fake_agent, helpers

C = "/v1/completions"
BODY = {"model": helpers.MODEL, "prompt": "Once upon a time", "max_tokens": 1}


class SleepyLeader(fake_agent.FakeLeader):
    """A leader whose replica sleeps until `WakeReplica`, then wakes after `wake_s`."""

    def __init__(self, replica_id: str, wake_s: float = 0.1) -> None:
        super().__init__(replica_id)
        self.release.set()
        self.sleeping, self.wake_s, self.wakes = True, wake_s, 0

    async def Describe(self, request: Any, context: Any) -> pb.DescribeReply:
        kv = pb.ReplicaKV(replica_id=self.replica_id, sleeping=self.sleeping)
        return pb.DescribeReply(agent_id="sleepy", kv=[kv])

    async def WakeReplica(self, request: Any, context: Any) -> pb.WakeReplicaReply:
        self.wakes += 1
        await asyncio.sleep(self.wake_s)
        self.sleeping = False
        return pb.WakeReplicaReply(awake=True, seconds=self.wake_s)


@pytest.fixture
async def sleepy() -> AsyncIterator[tuple[SleepyLeader, str]]:
    srv = transport.server()
    lead = SleepyLeader("r0")
    pb_grpc.add_AgentServicer_to_server(lead, srv)
    port = transport.add_port(srv, "127.0.0.1:0", tls=None)
    await srv.start()
    yield lead, f"127.0.0.1:{port}"
    await srv.stop(None)


async def _post(session: aiohttp.ClientSession, url: str) -> tuple[int, Any, dict[str, str]]:
    async with session.post(url + C, json=BODY) as r:
        return r.status, await r.json(), dict(r.headers)


async def test_a_held_request_completes_after_the_replica_wakes(
    tiny_llama: Path, session: aiohttp.ClientSession, sleepy: tuple[SleepyLeader, str]
) -> None:
    lead, address = sleepy
    gw = await helpers.start(
        str(tiny_llama), config.ReplicaEndpoint("r0", address), poll_interval_s=30.0
    )
    try:
        assert gw.service.replicas.states()["r0"].detail == "sleeping"
        status, body, _ = await _post(session, gw.url)
        assert status == 200, body
        assert lead.wakes == 1 and lead.started == 1
        holding = gw.service.holding
        assert holding is not None and holding.counts.released == 1 and holding.held == 0
        assert await helpers.metric(session, gw.url, "tessera_gateway_hold_outcomes_total",
                                    outcome="released") == 1  # fmt: skip
    finally:
        await gw.stop()


async def test_past_the_deadline_a_held_request_gets_503_with_retry_after(
    tiny_llama: Path, session: aiohttp.ClientSession
) -> None:
    cfg = hold.HoldConfig(max_held=4, deadline_s=0.3, retry_after_s=7)
    gw = await helpers.start(str(tiny_llama), hold=cfg)  # no replica at all: zero
    try:
        status, body, headers = await _post(session, gw.url)
        assert status == 503 and headers["Retry-After"] == "7"
        assert body["error"]["code"] == "wake_timeout"
        assert "0.3s" in body["error"]["message"] and body["error"]["type"] == "server_error"
    finally:
        await gw.stop()


async def test_a_full_hold_queue_answers_503_at_once_and_the_held_ones_are_not_lost(
    tiny_llama: Path, session: aiohttp.ClientSession
) -> None:
    cfg = hold.HoldConfig(max_held=3, deadline_s=20.0, retry_after_s=2)
    gw = await helpers.start(str(tiny_llama), hold=cfg)
    srv, lead, address = await fake_agent.start("r0")
    lead.release.set()
    try:
        held = [asyncio.ensure_future(_post(session, gw.url)) for _ in range(3)]
        holding = gw.service.holding
        assert holding is not None
        for _ in range(200):
            if holding.held == 3:
                break
            await asyncio.sleep(0.01)
        assert holding.held == 3
        async with session.get(gw.url + "/admin/v1/load") as r:
            assert (await r.json())["held"] == 3  # the autoscaler's demand from zero
        status, body, headers = await _post(session, gw.url)
        assert status == 503 and headers["Retry-After"] == "2"
        assert body["error"]["code"] == "hold_queue_full"
        gw.update_replicas([config.ReplicaEndpoint("r0", address)])  # scaled from zero
        results = await asyncio.wait_for(asyncio.gather(*held), 10)
        assert [s for s, _, _ in results] == [200, 200, 200]  # nothing lost
        assert lead.started == 3
        assert holding.counts.released == 3 and holding.counts.full == 1
    finally:
        await gw.stop()
        await srv.stop(None)


async def test_holding_unit_ready_at_once_off_and_deadline() -> None:
    ready = False

    async def refresh() -> None:
        return None

    h = hold.Holding(hold.HoldConfig(deadline_s=0.05, poll_s=0.01), lambda: ready, refresh)
    with pytest.raises(errors.ApiError) as exc:
        await h.wait()
    assert exc.value.code == "wake_timeout" and h.counts.expired == 1 and h.held == 0
    ready = True
    await h.wait()  # ready: no hold at all
    assert h.counts.released == 0
    off = hold.Holding(hold.HoldConfig(max_held=0), lambda: False, refresh)
    await off.wait()  # no holding: the dispatcher answers (503) as before
    down = hold.Holding(hold.HoldConfig(), lambda: False, refresh, waking=lambda: False)
    await down.wait()  # nothing asleep, replicas routed: no wake to wait for
    assert off.held == down.held == 0
    await h.close()


async def test_a_cancelled_hold_is_counted_and_frees_its_place() -> None:
    async def refresh() -> None:
        return None

    h = hold.Holding(hold.HoldConfig(deadline_s=30, poll_s=0.01), lambda: False, refresh)
    task = asyncio.ensure_future(h.wait())
    await asyncio.sleep(0.05)
    assert h.held == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert h.held == 0 and h.counts.cancelled == 1
    await h.close()


async def test_a_down_replica_that_does_not_sleep_fails_at_once_and_bad_requests_are_not_held(
    tiny_llama: Path, session: aiohttp.ClientSession
) -> None:
    gw = await helpers.start(
        str(tiny_llama), config.ReplicaEndpoint("gone", helpers.dead_address()),
        hold=hold.HoldConfig(deadline_s=30),
    )  # fmt: skip
    try:
        status, body, _ = await _post(session, gw.url)
        assert status == 503 and body["error"]["code"] == "no_replica_ready"
        empty = await helpers.start(str(tiny_llama), hold=hold.HoldConfig(deadline_s=30))
        try:
            async with session.post(empty.url + C, json={**BODY, "prompt": [7] * 5000}) as r:
                assert r.status == 400  # validated before any hold
        finally:
            await empty.stop()
    finally:
        await gw.stop()


def test_hold_config_is_validated() -> None:
    with pytest.raises(ValueError, match="max_held"):
        hold.HoldConfig(max_held=-1)
    with pytest.raises(ValueError, match="deadline_s"):
        hold.HoldConfig(deadline_s=0)
