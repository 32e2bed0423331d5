"""Text handling without servers: incremental detokenization, stop strings, chat templates,
request validation, routes files and model metadata."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.gateway import (
    chat_template,
    detokenize,
    errors,
    model_info,
    request_params,
    routes,
    stop_strings,
    tokenizer,
)
from tessera.rpc import sampling

MIXED = "héllo 日本語 🎉 ok, Once upon a time\nnaïve café"


@pytest.fixture(scope="module")
def codec(tiny_llama: Path) -> tokenizer.TextCodec:
    return tokenizer.TextCodec.load(tiny_llama)


def test_incremental_detokenization_never_splits_characters(codec: tokenizer.TextCodec) -> None:
    prompt = codec.encode("The quick brown fox")
    ids = codec.encode(MIXED, add_special_tokens=False)
    assert len(ids) > len(MIXED.encode()) // 3  # byte-level: multi-byte chars span tokens
    detok = detokenize.IncrementalDetokenizer(codec.decode, prompt)
    deltas = [detok.add([t]) for t in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == MIXED == codec.decode(ids)
    assert not any(detokenize.REPLACEMENT in d for d in deltas)
    assert "" in deltas  # some tokens only completed a character later


def test_incremental_detokenization_keeps_invalid_bytes_like_decode(
    codec: tokenizer.TextCodec,
) -> None:
    ids = codec.encode("日本", add_special_tokens=False)
    for seq in ([ids[0], *codec.encode("ab", add_special_tokens=False)], ids[:2], [1, *ids]):
        detok = detokenize.IncrementalDetokenizer(codec.decode, [ids[0]])  # prompt ends mid-char
        text = "".join(detok.add([t]) for t in seq) + detok.flush()
        assert text == codec.decode(seq)


def test_stop_matcher_holds_back_and_truncates() -> None:
    m = stop_strings.StopMatcher(["STOP", "\n\n"])
    out = [m.feed(d) for d in ["Hello S", "T", "ruggle", " and ST", "OP here"]]
    assert out == ["Hello ", "", "STruggle", " and ", ""]
    assert m.stopped and m.text == "Hello STruggle and " and m.feed("more") == ""
    m = stop_strings.StopMatcher(["abc"])
    assert [m.feed("xa"), m.feed("b"), m.flush()] == ["x", "", "ab"]  # never matched
    m = stop_strings.StopMatcher(["o w"])
    assert m.feed("hello world") == "hell" and m.stopped
    m = stop_strings.StopMatcher([])
    assert m.feed("abc") == "abc" and m.flush() == ""


def test_chat_templates(tiny_llama: Path) -> None:
    info = model_info.ModelInfo.load(tiny_llama)
    assert (info.context_len, info.vocab_size) == (1024, 512)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = chat_template.ChatTemplate(info.chat_template, info.bos_token).render(msgs)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    default = chat_template.ChatTemplate(None, "<s>")
    assert default.render(msgs) == "<s>system: Be brief.\n\nuser: Hi\n\nassistant:"
    strict = chat_template.ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    )
    with pytest.raises(errors.ApiError, match="user first") as info_err:
        strict.render(msgs)
    assert info_err.value.status == 400
    evil = chat_template.ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(errors.ApiError):  # the sandbox refuses attribute escapes
        evil.render(msgs)


def _err(fn: object, *args: object) -> errors.ApiError:
    with pytest.raises(errors.ApiError) as info:
        fn(*args)  # type: ignore[operator]
    return info.value


def test_request_validation() -> None:
    parse = request_params.parse_completion
    ok = parse({"model": "m", "prompt": "hi"}, "m")
    assert ok.sampling == sampling.Sampling(max_tokens=16, temperature=1.0)
    ok = parse(
        {
            "model": "m",
            "prompt": [[1, 2]],
            "stop": "x",
            "top_k": -1,
            "seed": 3,
            "user": "u",
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        },
        "m",
    )
    assert ok.prompts == ((1, 2),) and ok.stream and ok.include_usage
    assert ok.sampling.stop == ("x",) and ok.sampling.top_k == 0 and ok.sampling.seed == 3
    cases = [
        ({"prompt": "x"}, 400, "model"),
        ({"model": "other", "prompt": "x"}, 404, "model"),
        ({"model": "m"}, 400, "prompt"),
        ({"model": "m", "prompt": []}, 400, "prompt"),
        ({"model": "m", "prompt": ["a", 3]}, 400, "prompt"),
        ({"model": "m", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ({"model": "m", "prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
        ({"model": "m", "prompt": "x", "temperature": -0.1}, 400, "temperature"),
        ({"model": "m", "prompt": "x", "temperature": float("nan")}, 400, "temperature"),
        ({"model": "m", "prompt": "x", "top_p": 0}, 400, "top_p"),
        ({"model": "m", "prompt": "x", "top_p": 1.5}, 400, "top_p"),
        ({"model": "m", "prompt": "x", "top_k": -2}, 400, "top_k"),
        ({"model": "m", "prompt": "x", "n": 0}, 400, "n"),
        ({"model": "m", "prompt": "x", "n": 17}, 400, "n"),
        ({"model": "m", "prompt": "x", "logprobs": 21}, 400, "logprobs"),
        ({"model": "m", "prompt": "x", "logprobs": -1}, 400, "logprobs"),
        ({"model": "m", "prompt": "x", "logprobs": True}, 400, "logprobs"),
        ({"model": "m", "prompt": "x", "echo": True}, 400, "echo"),
        ({"model": "m", "prompt": "x", "stop": 3}, 400, "stop"),
        ({"model": "m", "prompt": "x", "stream_options": {}}, 400, "stream_options"),
    ]
    for body, status, param in cases:
        e = _err(parse, body, "m")
        assert (e.status, e.param) == (status, param), body
    chat = request_params.parse_chat
    ok_chat = chat(
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
            "max_completion_tokens": 4,
        },
        "m",
    )
    assert ok_chat.messages == (request_params.ChatMessage("user", "ab"),)
    assert ok_chat.sampling.logprobs is None
    assert parse({"model": "m", "prompt": "x", "logprobs": 0}, "m").sampling.logprobs == 0
    assert parse({"model": "m", "prompt": "x", "logprobs": 5}, "m").sampling.logprobs == 5
    one = [{"role": "user", "content": "x"}]
    asks = {"model": "m", "messages": one, "logprobs": True}
    assert chat(asks, "m").sampling.logprobs == 0
    assert chat({**asks, "top_logprobs": 4}, "m").sampling.logprobs == 4
    assert chat({**asks, "logprobs": False}, "m").sampling.logprobs is None
    for bad, param in (
        ({**asks, "logprobs": False, "top_logprobs": 2}, "top_logprobs"),
        ({**asks, "top_logprobs": 21}, "top_logprobs"),
        ({**asks, "logprobs": 3}, "logprobs"),
    ):
        assert _err(chat, bad, "m").param == param, bad
    assert ok_chat.sampling.max_tokens == 4
    assert (
        chat(
            {"model": "m", "messages": [{"role": "user", "content": "x"}]}, "m"
        ).sampling.max_tokens
        is None
    )
    for body in (
        {"model": "m"},
        {"model": "m", "messages": []},
        {"model": "m", "messages": "hi"},
        {"model": "m", "messages": [{"role": "robot", "content": "x"}]},
        {"model": "m", "messages": [{"role": "user"}]},
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
    ):
        assert _err(chat, body, "m").param == "messages", body
    e = _err(
        chat,
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function"}],
        },
        "m",
    )
    assert e.body()["error"]["code"] == "unsupported"


def test_routes_file(tmp_path: Path) -> None:
    doc = {
        "model": "tiny",
        "modelPath": "/m",
        "replicas": [{"id": "r0", "address": "10.0.0.1:50051"}, {"id": "r1", "address": ""}],
        "classShares": {"short": {"r0": 1}},
        "classes": [{"name": "short", "inputTokens": 100, "outputTokens": 20}],
    }
    path = tmp_path / "routes.json"
    path.write_text(json.dumps(doc))
    watcher = routes.RoutesWatcher(str(path))
    got = watcher.poll()
    assert got is not None and [r.replica_id for r in got.replicas] == ["r0"]  # r1: no address
    assert got.class_shares == {"short": {"r0": 1.0}}
    assert got.class_centroids == {"short": (100.0, 20.0)}
    assert (got.version, got.drain_deadline_s) == (0, routes.DEFAULT_DRAIN_DEADLINE_S)
    assert watcher.poll() is None  # unchanged
    cut = routes.parse({"replicas": [], "version": 4, "drainDeadlineSeconds": 2.5})
    assert (cut.version, cut.drain_deadline_s) == (4, 2.5)
    bad = [
        ({}, "replicas"),
        ({"replicas": [{"id": "r0", "address": "nohostport"}]}, "replicas\\[0\\].address"),
        ({"replicas": [{"id": "a", "address": "h:1"}, {"id": "a", "address": "h:2"}]}, "dup"),
        ({"replicas": [], "classShares": {"c": {"r": -1}}}, "classShares.c.r"),
        ({"replicas": [], "classes": [{"name": "c"}]}, "inputTokens"),
        ({"replicas": [], "version": -1}, "version"),
        ({"replicas": [], "version": 1.5}, "version"),
        ({"replicas": [], "drainDeadlineSeconds": "soon"}, "drainDeadlineSeconds"),
    ]
    for obj, match in bad:
        with pytest.raises(ValueError, match=match):
            routes.parse(obj)


def test_token_bytes_of_byte_level_and_byte_fallback_tokens(tiny_llama: Path) -> None:
    from tokenizers import Tokenizer, models

    from tessera.gateway import tokenizer

    codec = tokenizer.TextCodec.load(tiny_llama)
    text = "naïve café ✓"
    ids = codec.encode(text, add_special_tokens=False)
    assert b"".join(codec.token_bytes(i) for i in ids) == text.encode()
    fallback = Tokenizer(models.WordLevel({"<0xE2>": 0, "hi": 1, "<unk>": 2}, unk_token="<unk>"))
    sp = tokenizer.TextCodec(fallback)
    assert sp.token_bytes(0) == b"\xe2" and sp.token_bytes(1) == b"hi"


def test_first_token_is_an_event_even_before_its_character_completes(
    codec: tokenizer.TextCodec,
) -> None:
    """The stream's first chunk (and its HTTP headers) goes out at the first token even when
    that token only starts a multi-byte character (vLLM streams that chunk too, and TTFT is
    stamped there); later text-less tokens wait for their character, and the text is whole."""
    import asyncio
    from collections.abc import AsyncIterator

    from tessera.gateway import dispatch, text_stream

    ids = codec.encode("日本 ok", add_special_tokens=False)
    assert codec.decode(ids[:1]) != "日"  # the first token alone is not a whole character

    class OneTokenAtATime:
        async def generate(
            self, job: dispatch.Job, exclude: frozenset[str]
        ) -> AsyncIterator[dispatch.Chunk]:
            for i, t in enumerate(ids):
                last = i == len(ids) - 1
                yield dispatch.Chunk((t,), "length" if last else None, "r0")

    params = sampling.Sampling(max_tokens=len(ids), temperature=1.0, ignore_eos=True)
    job = dispatch.Job("x", tuple(codec.encode("a")), params, 0.0)
    gen = text_stream.TextGeneration(OneTokenAtATime(), codec.decode, job, ())  # type: ignore[arg-type]

    async def collect() -> list[text_stream.TextEvent]:
        return [ev async for ev in gen.events()]

    evs = asyncio.run(collect())
    assert evs[0].text == "" and evs[0].finish_reason is None  # the first token, no text yet
    assert all(ev.text for ev in evs[1:-1])  # afterwards only events that carry text
    assert "".join(ev.text for ev in evs) == "日本 ok"


def test_a_missing_routes_file_is_reported_once_until_it_returns(tmp_path: Path) -> None:
    """The gateway checks the file every 20 ms: a file that cannot be read raises once
    (the caller logs it), not at every check; when it is back it loads again."""
    path = tmp_path / "routes.json"
    path.write_text(json.dumps({"replicas": [{"id": "r0", "address": "127.0.0.1:1"}]}))
    watcher = routes.RoutesWatcher(str(path))
    assert watcher.poll() is not None
    path.unlink()
    with pytest.raises(ValueError, match=r"routes\.json"):
        watcher.poll()
    assert watcher.poll() is None  # said once
    path.write_text(json.dumps({"replicas": [{"id": "r1", "address": "127.0.0.1:2"}]}))
    got = watcher.poll()
    assert got is not None and [r.replica_id for r in got.replicas] == ["r1"]
