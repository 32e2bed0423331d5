"""A generation's choices as one response: the SSE stream, and each choice's log-probabilities.

`stream` writes every choice's events, interleaved, as OpenAI's server-sent events (the
headers go out with the first token's chunk, so failures before it are plain HTTP
errors); a client that does not take a write within `Limits.write_timeout_s` is dropped
(`CLIENT_CLOSED`). `LogprobShape` puts log-probabilities in the endpoint's shape, for
streamed and whole responses alike. Called by the generation handler in `app.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from tessera.gateway import (
    choices,
    dispatch,
    errors,
    logprobs,
    responses,
    text_stream,
    tokenizer,
)

log = logging.getLogger(__name__)

_UNBLOCKED = 16 << 10  # a transport buffer this small is far below asyncio's high-water mark
CLIENT_CLOSED = 499  # status recorded when the client went away (nginx's convention)


class LogprobShape:
    """Log-probabilities of one response in its endpoint's shape; for a completions
    stream it keeps the running `text_offset`."""

    def __init__(self, kind: str, codec: tokenizer.TextCodec) -> None:
        self.kind, self.codec, self.offset = kind, codec, 0

    def payload(self, entries: Sequence[dispatch.TokenLogprob]) -> dict[str, Any] | None:
        if not entries:
            return None
        text = self.codec.token_text
        if self.kind == "chat":
            return logprobs.chat(entries, text, self.codec.token_bytes)
        out = logprobs.completion(entries, text, self.offset)
        self.offset += sum(len(t) for t in out["tokens"])
        return out


async def stream(
    request: web.Request,
    gens: list[text_stream.TextGeneration],
    meta: responses.Meta,
    include_usage: bool,
    shapes: list[LogprobShape | None],
    prompt_tokens: int,
    write_timeout_s: float,
) -> tuple[web.StreamResponse, int]:
    """SSE response of every choice, interleaved. Headers go out with the first token's
    chunk (its text may still be empty: an incomplete UTF-8 character is held back, and
    vLLM streams that chunk too), so that failures (and retries on other replicas) before
    it still produce a plain HTTP error."""
    events = choices.merged(gens)
    try:
        first = await anext(events, None)
    except BaseException:
        await events.aclose()
        raise

    def chunk(
        index: int,
        text: str | None,
        reason: str | None = None,
        role: bool = False,
        lp: dict[str, Any] | None = None,
    ) -> bytes:
        body = responses.chunk(meta, text, reason, role, include_usage, lp, index)
        return responses.sse(body)

    texts = [responses.TextChunks(meta, include_usage, i) for i in range(len(gens))]
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )

    async def write(data: bytes) -> None:
        """One write; a client that does not take it within the limit is dropped. Below
        the transport's high-water mark a write cannot wait: no timer then."""
        t = request.transport
        if write_timeout_s <= 0 or (t is not None and t.get_write_buffer_size() < _UNBLOCKED):
            await resp.write(data)
            return
        try:
            async with asyncio.timeout(write_timeout_s):
                await resp.write(data)
        except TimeoutError:
            if request.transport is not None:
                request.transport.abort()
            raise _ClientGone from None

    try:
        return await _stream_events(request, resp, events, first, gens, meta, include_usage,
                                    shapes, prompt_tokens, write, chunk, texts)  # fmt: skip
    except _ClientGone:
        log.info("%s: the client read nothing for %gs; dropped", meta.id, write_timeout_s)
        return resp, CLIENT_CLOSED


class _ClientGone(Exception):
    """A stream's client stopped reading (the write timeout)."""


async def _stream_events(
    request: web.Request,
    resp: web.StreamResponse,
    events: AsyncGenerator[choices.IndexedEvent, None],
    first: choices.IndexedEvent | None,
    gens: list[text_stream.TextGeneration],
    meta: responses.Meta,
    include_usage: bool,
    shapes: list[LogprobShape | None],
    prompt_tokens: int,
    write: Callable[[bytes], Awaitable[None]],
    chunk: Callable[..., bytes],
    texts: list[responses.TextChunks],
) -> tuple[web.StreamResponse, int]:
    status = 200
    async with contextlib.aclosing(events):
        await resp.prepare(request)
        if meta.kind == "chat":
            for i in range(len(gens)):
                await write(chunk(i, "", role=True))
        item = first
        try:
            while item is not None:
                i, ev = item.index, item.event
                shape = shapes[i]
                lp = shape.payload(ev.logprobs) if shape else None
                if ev.text or ev.finish_reason is None:  # a first token without text too
                    await write(texts[i].event(ev.text) if lp is None else chunk(i, ev.text, lp=lp))
                    lp = None
                if ev.finish_reason is not None:
                    await write(chunk(i, None, ev.finish_reason, lp=lp))
                item = await anext(events, None)
            if include_usage:
                done = sum(g.completion_tokens for g in gens)
                use = responses.usage(prompt_tokens, done)
                await write(responses.sse(responses.usage_chunk(meta, use)))
        except errors.ApiError as exc:
            status = exc.status
            await write(responses.sse(exc.body()))
        except dispatch.ReplicaLost as exc:
            status = 503
            err = errors.unavailable(str(exc), code="replica_lost")
            await write(responses.sse(err.body()))
        await write(responses.DONE)
        await resp.write_eof()
    return resp, status
