"""Fuzzing the gateway's request bodies (hypothesis): never a 5xx; every 4xx has OpenAI's
error shape. The replica is an in-process fake leader that answers at once, so a valid
request completes (200) and only the gateway's own handling is under test.

Bodies are valid completion and chat requests with fields replaced by random JSON, random
fields added, or raw bytes. One event loop runs the gateway and the client: each request
drives it until the reply arrives.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.gateway import config, limits
from tests.gateway import fake_agent, helpers

EXAMPLES = 120
FIELDS = [
    "model", "prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "n",
    "stop", "seed", "stream", "logprobs", "top_logprobs", "ignore_eos", "stream_options",
    "echo", "user", "presence_penalty", "frequency_penalty", "logit_bias",
]  # fmt: skip
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
COMPLETION = {"model": helpers.MODEL, "prompt": "Once upon", "max_tokens": 2, "temperature": 0}
CHAT = {"model": helpers.MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    path = draw(st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
    if draw(st.integers(0, 9)) == 0:
        return path, draw(st.binary(max_size=64))
    body: dict[str, Any] = dict(COMPLETION if path == "/v1/completions" else CHAT)
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(FIELDS))
        if draw(st.integers(0, 4)) == 0:
            body.pop(key, None)
        else:
            body[key] = draw(JSON)
    return path, json.dumps(body, allow_nan=True).encode()


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def test_fuzzed_bodies_get_200_or_an_openai_shaped_4xx(
    tiny_llama: Path, loop: asyncio.AbstractEventLoop, capsys: pytest.CaptureFixture[str]
) -> None:
    run = loop.run_until_complete
    srv, leader, address = run(fake_agent.start("r0"))
    leader.release.set()
    gw = run(
        helpers.start(
            str(tiny_llama),
            config.ReplicaEndpoint("r0", address),
            limits=limits.Limits(max_tokens=64, max_n=4),
        )
    )
    session = run(_session())
    statuses: dict[int, int] = {}

    async def post(path: str, raw: bytes) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        async with session.post(gw.url + path, data=raw, headers=headers) as r:
            text = await r.text()
            try:
                return r.status, json.loads(text) if not text.startswith("data:") else text
            except json.JSONDecodeError:
                return r.status, text

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(bodies())
    def check(case: tuple[str, bytes]) -> None:
        status, body = run(post(*case))
        statuses[status] = statuses.get(status, 0) + 1
        assert status < 500, (case, status, body)
        if status >= 400:
            err = body["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["message"], body

    try:
        check()
    finally:
        run(session.close())
        run(gw.stop())
        run(srv.stop(None))
    with capsys.disabled():
        print(
            f"\nfuzz gateway bodies: {sum(statuses.values())} cases tried, statuses "
            f"{dict(sorted(statuses.items()))}, no 5xx"
        )
    assert sum(statuses.values()) >= EXAMPLES // 2


async def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession()
