"""Issue 16: the gateway's hot path formats and loops without changing a byte.

`responses.TextChunks` (SSE text events cut from a template) must give exactly the bytes
of `responses.sse(responses.chunk(...))`, which the streaming tests check end to end;
`tessera.event_loop` picks uvloop unless told otherwise."""

from __future__ import annotations

import asyncio
import json

import pytest

from tessera import event_loop
from tessera.gateway import responses

TEXTS = ["hi", "", " héllo 日本語 🎉", 'quote " back \\ slash', "\n\t\u2028\x00\x1f", "</s>"]


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("usage", [False, True])
@pytest.mark.parametrize("index", [0, 3])
def test_text_events_are_the_generic_chunks_bytes(kind: str, usage: bool, index: int) -> None:
    meta = responses.Meta(kind, "cmpl-0123456789abcdef", 1_700_000_000, "tiny-llama")
    fast = responses.TextChunks(meta, usage, index)
    for text in TEXTS:
        want = responses.sse(responses.chunk(meta, text, None, False, usage, None, index))
        assert fast.event(text) == want
        body = json.loads(fast.event(text)[len(b"data: ") :])
        choice = body["choices"][0]
        assert (choice["delta"]["content"] if kind == "chat" else choice["text"]) == text


def test_a_model_name_holding_the_marker_characters_still_round_trips() -> None:
    meta = responses.Meta("completion", "cmpl-x", 1, 'we"ird\\name')
    fast = responses.TextChunks(meta, False, 0)
    assert fast.event("a") == responses.sse(responses.chunk(meta, "a"))


def test_the_event_loop_is_uvloop_unless_asked_for_asyncio(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("uvloop")
    monkeypatch.delenv(event_loop.ENV, raising=False)
    assert event_loop.kind() == "uvloop"

    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert event_loop.run(which()).startswith("uvloop")
    monkeypatch.setenv(event_loop.ENV, "asyncio")
    assert event_loop.kind() == "asyncio"
    assert event_loop.run(which()).startswith("asyncio")
