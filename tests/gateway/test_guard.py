"""Gateway API keys and limits: 401 without a key, 413/400 over the limits, 429 with
Retry-After under saturation and per-key concurrency, and the OpenAI Python client seeing
the matching exception types (pointed at the local gateway; no network)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tessera.gateway import auth, config, limits, server
from tests.gateway import fake_agent, helpers

C = "/v1/completions"
BODY = {"model": helpers.MODEL, "prompt": "Once upon a time", "max_tokens": 1}


@pytest.fixture
async def leader() -> AsyncIterator[tuple[fake_agent.FakeLeader, str]]:
    srv, lead, address = await fake_agent.start("r0")
    yield lead, address
    lead.release.set()
    await srv.stop(None)


def _keys(tmp_path: Path, text: str = "alice sk-alice\nsk-anon  # no name\n") -> str:
    path = tmp_path / "keys"
    path.write_text(text)
    return str(path)


async def _post(
    session: aiohttp.ClientSession, url: str, body: Any, key: str | None = None
) -> tuple[int, dict[str, Any], dict[str, str]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with session.post(url + C, json=body, headers=headers) as r:
        return r.status, await r.json(), dict(r.headers)


def _openai_shaped(body: dict[str, Any]) -> bool:
    err = body.get("error", {})
    return set(err) == {"message", "type", "param", "code"} and bool(err["message"])


def test_keys_file_parses_names_and_rejects_garbage() -> None:
    keys = auth.parse_keys("alice sk-1\n\n# c\nsk-2\n")
    assert sorted(keys.values())[0] == "alice" and len(keys) == 2
    assert "sk-1" not in json.dumps(keys)  # only digests are kept
    with pytest.raises(ValueError, match="line 1"):
        auth.parse_keys("a b c\n")


async def test_api_keys_401_without_or_with_a_wrong_key(
    tiny_llama: Path,
    tmp_path: Path,
    leader: tuple[fake_agent.FakeLeader, str],
    session: aiohttp.ClientSession,
) -> None:
    lead, address = leader
    lead.release.set()
    gw = await helpers.start(
        str(tiny_llama),
        config.ReplicaEndpoint("r0", address),
        api_keys_file=_keys(tmp_path),
    )
    try:
        for key, code in ((None, 401), ("sk-wrong", 401), ("sk-alice", 200), ("sk-anon", 200)):
            status, body, _ = await _post(session, gw.url, BODY, key)
            assert status == code, body
            if code == 401:
                assert _openai_shaped(body) and body["error"]["code"] == "invalid_api_key"
        async with session.get(gw.url + "/health") as r:
            assert r.status == 200  # probes need no key
        # keys rotate without a restart: the file is re-read when it changes
        (tmp_path / "keys").write_text("bob sk-bob\n")
        import os

        os.utime(tmp_path / "keys", (1, 1))
        assert (await _post(session, gw.url, BODY, "sk-alice"))[0] == 401
        assert (await _post(session, gw.url, BODY, "sk-bob"))[0] == 200
    finally:
        await gw.stop()


async def test_limits_413_and_400(
    tiny_llama: Path,
    leader: tuple[fake_agent.FakeLeader, str],
    session: aiohttp.ClientSession,
) -> None:
    lead, address = leader
    lead.release.set()
    lim = limits.Limits(max_prompt_tokens=8, max_tokens=4, max_n=2)
    gw = await helpers.start(
        str(tiny_llama), config.ReplicaEndpoint("r0", address), limits=lim, max_body_bytes=2048
    )
    try:
        cases = [
            ({**BODY, "prompt": "x" * 4096}, 413, "body_too_large", None),
            ({**BODY, "prompt": [1] * 9}, 400, "prompt_too_long", "prompt"),
            ({**BODY, "max_tokens": 5}, 400, "invalid_value", "max_tokens"),
            ({**BODY, "n": 3}, 400, "invalid_value", "n"),
        ]
        for body, status, code, param in cases:
            got, err, _ = await _post(session, gw.url, body)
            assert (got, err["error"]["code"], err["error"]["param"]) == (status, code, param)
            assert _openai_shaped(err)
        ok, reply, _ = await _post(session, gw.url, {**BODY, "prompt": [1] * 8, "n": 2})
        assert ok == 200 and len(reply["choices"]) == 2
        # an omitted max_tokens is capped at the limit, not refused
        assert limits.check_request(lim, 3, None, 1000, 1) == 4
    finally:
        await gw.stop()


async def _hold(
    session: aiohttp.ClientSession, url: str, lead: fake_agent.FakeLeader, n: int, key: str | None
) -> list[asyncio.Task[Any]]:
    before = lead.started
    tasks = [asyncio.create_task(_post(session, url, BODY, key)) for _ in range(n)]
    for _ in range(200):
        if lead.started >= before + n:
            return tasks
        await asyncio.sleep(0.02)
    raise AssertionError(f"only {lead.started - before} of {n} requests reached the agent")


async def test_429_with_retry_after_when_saturated_and_per_key(
    tiny_llama: Path,
    tmp_path: Path,
    leader: tuple[fake_agent.FakeLeader, str],
    session: aiohttp.ClientSession,
) -> None:
    lead, address = leader
    lim = limits.Limits(max_concurrent_per_key=2, max_in_flight_per_replica=3, retry_after_s=2)
    gw = await helpers.start(
        str(tiny_llama),
        config.ReplicaEndpoint("r0", address),
        api_keys_file=_keys(tmp_path),
        limits=lim,
    )
    try:
        held = await _hold(session, gw.url, lead, 2, "sk-alice")
        status, body, headers = await _post(session, gw.url, BODY, "sk-alice")
        assert status == 429 and headers["Retry-After"] == "2", body
        assert _openai_shaped(body) and "API key" in body["error"]["message"]
        held += await _hold(session, gw.url, lead, 1, "sk-anon")  # 3 in flight: saturated
        status, body, headers = await _post(session, gw.url, BODY, "sk-anon")
        assert status == 429 and headers["Retry-After"] == "2"
        assert "saturated" in body["error"]["message"]
        lead.release.set()
        assert [s for s, _, _ in await asyncio.gather(*held)] == [200, 200, 200]
        assert (await _post(session, gw.url, BODY, "sk-alice"))[0] == 200  # slots came back
    finally:
        await gw.stop()


async def test_openai_client_sees_the_right_exceptions(
    tiny_llama: Path,
    tmp_path: Path,
    leader: tuple[fake_agent.FakeLeader, str],
) -> None:
    lead, address = leader
    lim = limits.Limits(max_tokens=4, max_in_flight_per_replica=1)
    gw = await helpers.start(
        str(tiny_llama),
        config.ReplicaEndpoint("r0", address),
        api_keys_file=_keys(tmp_path),
        limits=lim,
    )

    def client(key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(api_key=key, base_url=gw.url + "/v1", max_retries=0)

    try:
        with pytest.raises(openai.AuthenticationError) as auth_err:
            await client("sk-wrong").completions.create(model=helpers.MODEL, prompt="hi")
        assert auth_err.value.code == "invalid_api_key"
        with pytest.raises(openai.BadRequestError) as bad:
            await client("sk-alice").completions.create(
                model=helpers.MODEL, prompt="hi", max_tokens=5
            )
        assert bad.value.param == "max_tokens"
        held = asyncio.create_task(
            client("sk-alice").completions.create(model=helpers.MODEL, prompt="hi", max_tokens=1)
        )
        for _ in range(200):
            if lead.started:
                break
            await asyncio.sleep(0.02)
        with pytest.raises(openai.RateLimitError) as limited:
            await client("sk-anon").completions.create(
                model=helpers.MODEL, prompt="hi", max_tokens=1
            )
        assert limited.value.response.headers["retry-after"] == "1"
        lead.release.set()
        done = await held
        assert done.choices[0].finish_reason == "length"
    finally:
        await gw.stop()


@pytest.mark.parametrize("path", ["/v1/models"])
async def test_models_needs_a_key_too(
    tiny_llama: Path, tmp_path: Path, path: str, session: aiohttp.ClientSession
) -> None:
    gw: server.GatewayHandle = await helpers.start(
        str(tiny_llama),
        config.ReplicaEndpoint("gone", helpers.dead_address()),
        api_keys_file=_keys(tmp_path),
    )
    try:
        async with session.get(gw.url + path) as r:
            assert r.status == 401
        async with session.get(gw.url + path, headers={"Authorization": "Bearer sk-anon"}) as r:
            assert r.status == 200
    finally:
        await gw.stop()
