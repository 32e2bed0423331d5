"""The one SSE client against a stand-in gateway: timings, text, usage and every failure
recorded, never raised."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from tessera.bench import client


def _sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


async def _gateway(mode: str) -> web.AppRunner:
    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["stream"] and body["temperature"] == 0 and body["ignore_eos"]
        if mode == "busy":
            return web.Response(status=503, text="overloaded")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if mode == "error":
            await resp.write(_sse({"choices": [{"text": "a"}]}, {"error": {"message": "boom"}}))
            return resp
        if mode == "held":  # the first token's event carries no text yet (part of a char)
            await resp.write(_sse({"choices": [{"text": "", "finish_reason": None}]})[:-14])
            await asyncio.sleep(0.3)
        for word in ("he", "llo"):
            await resp.write(_sse({"choices": [{"text": word, "finish_reason": None}]})[:-14])
            await asyncio.sleep(0.01)
        last = {"choices": [{"text": "", "finish_reason": "length"}]}
        await resp.write(_sse(last, {"choices": [], "usage": {"completion_tokens": 2}}))
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


async def _one(mode: str) -> client.Stream:
    runner = await _gateway(mode)
    try:
        port = runner.addresses[0][1]
        s = client.Stream([5, 6, 7], 2)
        await client.replay(f"http://127.0.0.1:{port}", "m", [s], timeout_s=10)
        return s
    finally:
        await runner.cleanup()


def test_a_stream_records_text_timings_and_usage() -> None:
    s = asyncio.run(_one("ok"))
    assert s.ok and s.text == "hello" and s.usage_tokens == 2
    assert s.ttft is not None and s.ttft > 0 and len(s.chunk_times) == 2
    assert len(s.itl()) == 1 and s.itl()[0] > 0 and s.finish >= s.sent


def test_failures_are_recorded_not_raised() -> None:
    busy = asyncio.run(_one("busy"))
    assert not busy.ok and busy.error.startswith("503: overloaded")
    err = asyncio.run(_one("error"))
    assert not err.ok and "boom" in err.error and err.text == "a"


def test_time_to_first_token_is_the_first_event_even_without_text() -> None:
    """As vLLM's benchmark client: the first event with a choice is the first token, even
    when the gateway holds its text back (an incomplete UTF-8 character)."""
    s = asyncio.run(_one("held"))
    assert s.ok and s.text == "hello" and len(s.chunk_times) == 2
    assert s.ttft is not None and s.ttft < 0.25 <= s.chunk_times[0] - s.sent
