"""OpenAI response bodies and SSE framing for completions and chat completions (pure).

Called by the handlers in `app.py`. `kind` is "completion" (`/v1/completions`, objects
`text_completion`) or "chat" (`/v1/chat/completions`, objects `chat.completion` and
`chat.completion.chunk` with `delta`s).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class Meta:
    """What every body of one response repeats."""

    kind: str  # "completion" or "chat"
    id: str
    created: int
    model: str


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass(frozen=True)
class Choice:
    """One finished choice of a non-streamed response."""

    text: str
    finish_reason: str
    logprobs: dict[str, Any] | None = None  # already in the endpoint's shape


def full(meta: Meta, choices: list[Choice], use: dict[str, int]) -> dict[str, Any]:
    """A non-streamed response."""
    out: list[dict[str, Any]] = []
    for i, c in enumerate(choices):
        body: dict[str, Any] = {"index": i}
        if meta.kind == "chat":
            body["message"] = {"role": "assistant", "content": c.text}
        else:
            body["text"] = c.text
        out.append({**body, "logprobs": c.logprobs, "finish_reason": c.finish_reason})
    return {
        "id": meta.id,
        "object": "chat.completion" if meta.kind == "chat" else "text_completion",
        "created": meta.created,
        "model": meta.model,
        "choices": out,
        "usage": use,
    }


def chunk(
    meta: Meta,
    text: str | None,
    finish_reason: str | None = None,
    role: bool = False,
    with_usage_field: bool = False,
    logprobs: dict[str, Any] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    """One streamed chunk of choice `index`; for chat, `role=True` opens its message."""
    if meta.kind == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        obj = "chat.completion.chunk"
    else:
        choice = {
            "index": index,
            "text": text or "",
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        obj = "text_completion"
    body = {
        "id": meta.id,
        "object": obj,
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
    }
    if with_usage_field:
        body["usage"] = None  # OpenAI: null on every chunk but the usage chunk
    return body


def usage_chunk(meta: Meta, use: dict[str, int]) -> dict[str, Any]:
    """The last chunk with `stream_options.include_usage`: no choices, the usage."""
    return {
        "id": meta.id,
        "object": "chat.completion.chunk" if meta.kind == "chat" else "text_completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [],
        "usage": use,
    }


def sse(obj: dict[str, Any]) -> bytes:
    """One server-sent event carrying `obj` as JSON."""
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


_MARK = "\x00tessera-text\x00"  # stands for the text while a template is cut


class TextChunks:
    """The SSE events of one choice's text deltas (no finish reason, no log-probabilities),
    the bulk of a stream: the event is built once with a marker for the text and cut
    around it, so each delta costs one string encoding instead of a dict and a whole
    `json.dumps`. The bytes are exactly `sse(chunk(meta, text, ...))`'s."""

    def __init__(self, meta: Meta, with_usage_field: bool, index: int) -> None:
        probe = sse(chunk(meta, _MARK, None, False, with_usage_field, None, index))
        self._head, self._tail = probe.split(json.dumps(_MARK).encode())

    def event(self, text: str) -> bytes:
        return self._head + json.dumps(text, ensure_ascii=False).encode() + self._tail
