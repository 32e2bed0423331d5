"""Hostile input to the gateway: every case is a 4xx naming the field, never a 5xx, and
afterwards the gateway is back to idle (no routing ticket, in-flight record or admission
slot left, resident memory back within bounds).

One gateway (over a scripted in-process leader that answers at once) serves every case;
the cases are the issue's attacks (integer ranges, JSON depth and number size, lone
surrogates, oversized bodies, stop floods, character budgets, ...) and more.
"""

from __future__ import annotations

import asyncio
import json
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tessera.gateway import config, limits, server
from tests.gateway import helpers
from tests.security import scripted_leader

C, CHAT = "/v1/completions", "/v1/chat/completions"
M = helpers.MODEL
OK = {"model": M, "prompt": "Once upon", "max_tokens": 2, "temperature": 0}
MSG = [{"role": "user", "content": "hi"}]
OK_CHAT = {"model": M, "messages": MSG, "max_tokens": 2}
BIG = "9" * 5000  # a 5,000-digit integer


def _raw(path: str, text: str) -> tuple[str, bytes]:
    return path, text.encode()


def _c(**fields: Any) -> tuple[str, bytes]:
    return C, json.dumps({**OK, **fields}).encode()


def _chat(**fields: Any) -> tuple[str, bytes]:
    return CHAT, json.dumps({**OK_CHAT, **fields}).encode()


def _with(field: str, raw_value: str, path: str = C) -> tuple[str, bytes]:
    """A valid body with `field` set to `raw_value` written verbatim (JSON the stdlib
    would not produce: huge numbers, NaN, lone surrogates, deep nesting)."""
    base = dict(OK if path == C else OK_CHAT)
    base.pop(field, None)
    text = json.dumps(base)[:-1] + f', "{field}": {raw_value}' + "}"
    return path, text.encode()


def _deep(n: int) -> str:
    return "[" * n + "]" * n


# (id, (path, body), status, param)
CASES: list[tuple[str, tuple[str, bytes], int, str | None]] = [
    ("seed-2^63", _c(seed=2**63), 400, "seed"),
    ("seed-1e19", _with("seed", "1e19"), 400, "seed"),
    ("seed-below-int64", _c(seed=-(2**63) - 1), 400, "seed"),
    ("seed-5000-digits", _with("seed", BIG), 400, "seed"),
    ("seed-string", _c(seed="1"), 400, "seed"),
    ("top_k-2^31", _c(top_k=2**31), 400, "top_k"),
    ("top_k-1e19", _with("top_k", "1e19"), 400, "top_k"),
    ("top_k-negative", _c(top_k=-2), 400, "top_k"),
    ("max_tokens-2^31", _c(max_tokens=2**31), 400, "max_tokens"),
    ("max_tokens-5000-digits", _with("max_tokens", BIG), 400, "max_tokens"),
    ("max_tokens-1e400", _with("max_tokens", "1e400"), 400, "max_tokens"),
    ("max_tokens-zero", _c(max_tokens=0), 400, "max_tokens"),
    ("max_tokens-over-context", _c(max_tokens=5000), 400, "max_tokens"),
    ("n-2^64", _c(n=2**64), 400, "n"),
    ("n-17", _c(n=17), 400, "n"),
    ("logprobs-2^63", _c(logprobs=2**63), 400, "logprobs"),
    ("temperature-1e39", _c(temperature=1e39), 400, "temperature"),
    ("temperature-5000-digits", _with("temperature", BIG), 400, "temperature"),
    ("temperature-NaN", _with("temperature", "NaN"), 400, "temperature"),
    ("temperature-Infinity", _with("temperature", "-Infinity"), 400, "temperature"),
    ("temperature-string", _c(temperature="hot"), 400, "temperature"),
    ("top_p-underflow", _with("top_p", "1e-400"), 400, "top_p"),
    ("top_p-2", _c(top_p=2), 400, "top_p"),
    ("json-3000-deep", _with("user", _deep(3000)), 400, None),
    ("json-40-deep", _with("user", _deep(40)), 400, None),
    ("json-100000-deep", _with("user", _deep(100_000)), 400, None),
    ("json-700000-empty-lists", _with("user", "[" + "[]," * 699_000 + "[]]"), 400, None),
    ("seed-4000-digits", _with("seed", "9" * 4000), 400, "seed"),
    ("prompt-600k-token-ids", _c(prompt=[1] * 600_000), 400, "prompt"),
    ("lone-surrogate-prompt", _with("prompt", '"\\ud800"'), 400, "prompt"),
    ("lone-low-surrogate", _with("prompt", '"a\\udc00b"'), 400, "prompt"),
    (
        "lone-surrogate-chat",
        _with("messages", '[{"role": "user", "content": "\\udbff"}]', CHAT),
        400,
        "messages",
    ),
    ("lone-surrogate-stop", _with("stop", '["\\ud83d"]'), 400, "stop"),
    ("invalid-utf8", (C, b'{"model": "tiny", "prompt": "\xff\xfe"}'), 400, None),
    ("not-json", _raw(C, "{nope"), 400, None),
    ("empty-body", _raw(C, ""), 400, None),
    ("body-is-a-list", _raw(C, "[1, 2]"), 400, None),
    ("body-over-2MiB", _c(prompt="a" * (2 << 20)), 413, None),
    ("stop-flood-10000", _c(stop=["x"] * 10_000), 400, "stop"),
    ("stop-5-strings", _c(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    ("stop-65-chars", _c(stop=["s" * 65]), 400, "stop"),
    ("stop-number", _c(stop=7), 400, "stop"),
    ("prompt-over-char-budget", _c(prompt="ab " * 20_000), 400, "prompt"),
    (
        "chat-over-char-budget",
        _chat(messages=[{"role": "user", "content": "z" * 40_000}]),
        400,
        "messages",
    ),
    ("prompt-token-out-of-vocab", _c(prompt=[1, 10**6]), 400, "prompt"),
    ("prompt-token-5000-digits", _with("prompt", f"[1, {BIG}]"), 400, "prompt"),
    ("prompt-token-negative", _c(prompt=[-1]), 400, "prompt"),
    ("prompt-17-prompts", _c(prompt=["a"] * 17), 400, "prompt"),
    ("prompt-list-with-empty", _c(prompt=["a", []]), 400, "prompt"),
    ("prompt-object", _c(prompt={"a": 1}), 400, "prompt"),
    ("prompt-too-many-tokens", _c(prompt=[5] * 1024), 400, "prompt"),
    ("model-object", _c(model={"a": 1}), 400, "model"),
    ("model-unknown", _c(model="gpt-5"), 404, "model"),
    ("stream-string", _c(stream="yes"), 400, "stream"),
    (
        "stream_options-no-stream",
        _c(stream_options={"include_usage": True}),
        400,
        "stream_options",
    ),
    ("logit_bias", _c(logit_bias={"1": 100}), 400, "logit_bias"),
    ("best_of-2", _c(best_of=2), 400, "best_of"),
    ("echo", _c(echo=True), 400, "echo"),
    ("messages-not-list", _chat(messages="hi"), 400, "messages"),
    ("messages-bad-role", _chat(messages=[{"role": "root", "content": "x"}]), 400, "messages"),
    (
        "messages-image",
        _chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
        400,
        "messages",
    ),
    (
        "response_format-json",
        _chat(response_format={"type": "json_object"}),
        400,
        "response_format",
    ),
    ("tools", _chat(tools=[{"type": "function"}]), 400, "tools"),
    ("top_logprobs-2^40", _chat(logprobs=True, top_logprobs=2**40), 400, "top_logprobs"),
]


@dataclass
class Rig:
    loop: asyncio.AbstractEventLoop
    gw: server.GatewayHandle
    session: aiohttp.ClientSession
    rss_start_kib: int

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)


def _rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


@pytest.fixture(scope="module")
def rig(tiny_llama: Path) -> Iterator[Rig]:
    loop = asyncio.new_event_loop()
    srv, _, address = loop.run_until_complete(scripted_leader.start("r0", scripted_leader.Script()))
    gw = loop.run_until_complete(
        helpers.start(
            str(tiny_llama),
            config.ReplicaEndpoint("r0", address),
            limits=limits.Limits(max_tokens=64, max_n=4),
        )
    )
    session = loop.run_until_complete(_session())
    r = Rig(loop, gw, session, 0)
    for _ in range(20):  # warm up: the first requests allocate caches for good
        status, _ = r.run(_post(r, *_c()))
        assert status == 200
        r.run(_post(r, *CASES[0][1]))
    r.rss_start_kib = _rss_kib()
    yield r
    r.run(session.close())
    r.run(gw.stop())
    r.run(srv.stop(None))
    loop.close()


async def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession()


async def _post(rig: Rig, path: str, raw: bytes) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    async with rig.session.post(rig.gw.url + path, data=raw, headers=headers) as r:
        text = await r.text()
        return r.status, json.loads(text)


def test_there_are_at_least_forty_cases() -> None:
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(
    ("path_body", "status", "param"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_hostile_request_is_a_4xx_naming_the_field(
    rig: Rig, path_body: tuple[str, bytes], status: int, param: str | None
) -> None:
    got, body = rig.run(_post(rig, *path_body))
    assert got == status, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param, err
    assert "Traceback" not in err["message"] and "/" not in (err["param"] or "")


def test_gateway_is_idle_afterwards(rig: Rig) -> None:
    """Run after the cases (file order): nothing leaked."""

    async def every_case() -> None:
        await asyncio.gather(*(_post(rig, *c[1]) for c in CASES))

    for _ in range(3):  # every case again, concurrently
        rig.run(every_case())
    svc = rig.gw.service
    assert svc.dispatcher._router.outstanding("r0") == 0
    assert svc.dispatcher.inflight.count("r0") == 0
    in_flight = rig.run(
        helpers.metric(rig.session, rig.gw.url, "tessera_gateway_in_flight_requests")
    )
    assert in_flight == 0
    errors_5xx = 0.0
    for code in ("500", "502", "503", "504"):
        errors_5xx += rig.run(
            helpers.metric(rig.session, rig.gw.url, "tessera_gateway_requests_total", status=code)
        )
    assert errors_5xx == 0
    status, _ = rig.run(_post(rig, *_c()))
    assert status == 200
    grown_mib = (_rss_kib() - rig.rss_start_kib) / 1024
    assert grown_mib < 100, f"RSS grew {grown_mib:.0f} MiB"
