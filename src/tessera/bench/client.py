"""The one streaming client of the gateway's OpenAI-compatible API, for benchmarks.

`Stream` is one completion request and what came back, filled in as its server-sent
events arrive (a bench may watch it mid-flight: `ttft` set means tokens are flowing);
`send` waits for the request's arrival time, posts it to `/v1/completions` with
`stream: true` (greedy, EOS ignored, usage in the last chunk) and records send time,
time to first token (the first event with a choice, even one with no text yet, as vLLM's
benchmark client counts it), the time of each text chunk, the text, the usage count and
whether a finish reason arrived. Failures (HTTP status, an `error` event, the connection)
are recorded in `error`, never raised. `replay` sends many on their schedule over one
session. `agent_greedy` streams one request from an agent's gRPC `Generate`. `events`
decodes a server-sent event stream (the one parser). Called by the serving benchmarks
(`tessera.cli.bench_*`, `tessera_agent.bench_gpu_serve`) and tests.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

ERROR_CHARS = 200  # an error is kept as an example, cut to this length
DONE = "[DONE]"  # the last event of an OpenAI stream


@dataclass
class Stream:
    """One streamed completion: the request, then what arrived (filled in place)."""

    prompt: list[int]  # token ids
    max_tokens: int
    at: float = 0.0  # seconds after the replay's start when it is sent
    sent: float = 0.0  # perf_counter() when it was sent
    ttft: float | None = None  # seconds from `sent` to the first token's event (text or not)
    finish: float = 0.0  # perf_counter() when the stream ended
    chunk_times: list[float] = field(default_factory=list)  # perf_counter() per text chunk
    text: str = ""
    done: bool = False  # a finish reason arrived
    usage_tokens: int | None = None  # completion_tokens of the usage chunk
    error: str = ""

    @property
    def ok(self) -> bool:
        """Finished, with no error."""
        return self.done and not self.error

    def itl(self) -> list[float]:
        """Gaps between consecutive text chunks (seconds)."""
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)]


def payload(line: str) -> Any | None:
    """What one line of a server-sent event stream carries: its `data:` decoded from
    JSON, `DONE` (the string) for the terminator, None for any other line."""
    line = line.strip()
    if not line.startswith("data: "):
        return None
    data = line[len("data: ") :]
    return data if data == DONE else json.loads(data)


def decode(text: str) -> list[Any]:
    """The payloads of a whole event stream's text, in order (see `payload`)."""
    return [p for p in map(payload, text.splitlines()) if p is not None]


async def events(content: AsyncIterable[bytes]) -> AsyncIterator[Any]:
    """The payloads of a stream as they arrive (`content` yields lines: an aiohttp
    response's `content`)."""
    async for raw in content:
        p = payload(raw.decode())
        if p is not None:
            yield p


def body(model: str, s: Stream) -> dict[str, Any]:
    """The request body: greedy, EOS ignored, streamed with usage."""
    return {
        "model": model,
        "prompt": s.prompt,
        "max_tokens": s.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def send(session: Any, url: str, model: str, s: Stream, t0: float | None = None) -> None:
    """Send `s` at `t0 + s.at` (now when t0 is None) and read its stream into `s`."""
    if t0 is not None:
        await asyncio.sleep(max(0.0, t0 + s.at - time.perf_counter()))
    s.sent = time.perf_counter()
    parts: list[str] = []
    try:
        async with session.post(f"{url}/v1/completions", json=body(model, s)) as resp:
            if resp.status != 200:
                s.error = f"{resp.status}: {(await resp.text())[:ERROR_CHARS]}"
                return
            async for chunk in events(resp.content):
                if chunk == DONE:
                    continue
                if "error" in chunk:
                    s.error = str(chunk["error"])[:ERROR_CHARS]
                    return
                if chunk.get("usage"):
                    s.usage_tokens = chunk["usage"]["completion_tokens"]
                for ch in chunk.get("choices") or ():
                    now = time.perf_counter()
                    if s.ttft is None:  # the first token's event, text or not (as vLLM's client)
                        s.ttft = now - s.sent
                    if ch.get("text"):
                        s.chunk_times.append(now)
                        parts.append(ch["text"])
                    if ch.get("finish_reason"):
                        s.done = True
    except Exception as exc:  # any client-side failure is a lost request, reported
        s.error = f"client error: {exc!r}"[:ERROR_CHARS]
    finally:
        s.finish = time.perf_counter()
        s.text = "".join(parts)


def session(timeout_s: float = 900.0) -> Any:
    """An aiohttp session for a replay: a whole-request timeout, and a connection pool
    without aiohttp's default cap of 100 (an open-loop replay sends each request on time,
    as vLLM's benchmark client does; at the cap, later ones waited for a connection and
    that wait counted as their TTFT). Call it inside the event loop that uses it."""
    import aiohttp

    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        connector=aiohttp.TCPConnector(limit=0),
    )


async def replay(
    url: str, model: str, streams: Sequence[Stream], timeout_s: float = 900.0
) -> float:
    """Send every stream on its schedule over one session; returns the replay's t0."""
    async with session(timeout_s) as sess:
        t0 = time.perf_counter()
        await asyncio.gather(*(send(sess, url, model, s, t0) for s in streams))
    return t0


async def agent_greedy(
    stub: Any, pb: Any, rid: str, prompt: list[int], new: int
) -> tuple[list[int], list[float]]:
    """Greedy tokens of one request straight to an agent's `Generate` (gRPC, `pb` its
    messages module) and the time each arrived; the benches that bypass the gateway."""
    from tessera.rpc import sampling as rpc_sampling

    params = rpc_sampling.to_proto(rpc_sampling.Sampling(max_tokens=new, ignore_eos=True))
    req = pb.GenerateRequest(replica_id=rid, prompt_token_ids=list(prompt), params=params)
    out: list[int] = []
    times: list[float] = []
    async for ch in stub.Generate(req, timeout=600):
        now = time.perf_counter()
        out.extend(ch.token_ids)
        times.extend([now] * len(ch.token_ids))
    return out, times
