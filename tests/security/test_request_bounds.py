"""Request fields at their bounds, unit by unit: tiny temperatures are greedy, seeds wrap
inside int64, choice and retry ids never collide, prompt lists, streamed text never
splits a UTF-8 character."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tessera.gateway import app, config, detokenize, dispatch, request_params, tokenizer
from tessera.rpc import sampling
from tests.gateway import helpers
from tests.security import scripted_leader as sl

M = helpers.MODEL


def _parse(**fields: object) -> sampling.Sampling:
    return request_params.parse_completion({"model": "m", "prompt": "x", **fields}, "m").sampling


def test_tiny_temperatures_and_nuclei_are_greedy() -> None:
    for t in (1e-45, 5e-324, 1e-6):
        assert _parse(temperature=t).temperature == 0.0
    s = _parse(temperature=0.7, top_p=1e-30)
    assert (s.temperature, s.top_p) == (0.0, 1.0)
    assert _parse(temperature=0.5).temperature == 0.5


def test_seeds_wrap_inside_int64() -> None:
    top = request_params.INT64_MAX
    assert dispatch.seed_plus(top, 1) == request_params.INT64_MIN
    assert dispatch.seed_plus(5, 3) == 8
    assert _parse(seed=top).seed == top


def _job(rid: str = "cmpl-x", seed: int | None = 1) -> dispatch.Job:
    return dispatch.Job(rid, (1, 2), sampling.Sampling(max_tokens=4, seed=seed), 0.0)


def test_choice_and_retry_ids_never_collide() -> None:
    base = _job()
    choices = [app._nth(base, i, i) for i in range(4)]
    ids = {
        c.request(r, attempt).request_id for c in choices for r in ("a",) for attempt in range(4)
    }
    assert len(ids) == 16
    assert app._nth(base, 3, 3).seed == 4


async def test_a_list_of_prompts_gets_n_choices_each(
    tiny_llama: Path, session: aiohttp.ClientSession
) -> None:
    srv, _, address = await sl.start("r0", sl.Script())
    gw = await helpers.start(str(tiny_llama), config.ReplicaEndpoint("r0", address))
    try:
        body = {"model": M, "prompt": ["Once upon", [5, 6, 7]], "n": 2, "max_tokens": 3}
        status, reply = await helpers.post(session, gw.url + "/v1/completions", body)
        assert status == 200, reply
        assert [c["index"] for c in reply["choices"]] == [0, 1, 2, 3]
        assert reply["usage"]["completion_tokens"] == 12
        one, _ = await helpers.post(session, gw.url + "/v1/completions", {**body, "n": 1})
        assert one == 200
        events = await helpers.post_stream(session, gw.url + "/v1/completions", body)
        indices = {c["index"] for e in events if isinstance(e, dict) for c in e["choices"]}
        assert indices == {0, 1, 2, 3}
    finally:
        await gw.stop()
        await srv.stop(None)


def test_streamed_text_never_splits_a_utf8_character(tiny_llama: Path) -> None:
    codec = tokenizer.TextCodec.load(tiny_llama)
    text = "héllo 😀 wörld ✓ 漢字 done"
    ids = codec.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split())  # multi-byte characters span several tokens
    detok = detokenize.IncrementalDetokenizer(codec.decode)
    deltas = [detok.add([t]) for t in ids] + [detok.flush()]
    assert "".join(deltas) == codec.decode(ids)
    assert all("\ufffd" not in d for d in deltas), deltas
