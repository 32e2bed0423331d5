"""`GenerateMux` on a real agent process: many requests on one stream get transformers'
greedy tokens, news of several requests shares a message, each bad request fails alone
with the status the per-request `Generate` gives, a cancel frees the request's pages, and
half-closing ends the stream once its requests finished."""

from __future__ import annotations

import queue
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.rpc.v1 import agent_pb2 as pb
from tests.agent.test_agent_rpc import NEW, Start, _code, _stub, generate, load_replica
from tests.conftest import hf_greedy

pytestmark = pytest.mark.slow
PAGE_BYTES = 2 * 8 * 16 * 2 * 64 * 4  # one KV page (16 tokens) of the 8-layer tiny model


def _used(stub: Any) -> int:
    (r0,) = [kv for kv in stub.Describe(pb.DescribeRequest()).kv if kv.replica_id == "r0"]
    return int(r0.pages_used)


def test_one_stream_serves_many_requests_and_fails_bad_ones_alone(
    agents_factory: Start, tiny_llama: Path, prompts: list[list[int]]
) -> None:
    (agent,) = agents_factory(1)
    load_replica([agent], tiny_llama, [(0, 8)])
    load_replica([agent], tiny_llama, [(0, 8)], "small", kv_bytes=4 * PAGE_BYTES)  # 64 tokens
    stub = _stub(agent)
    out: queue.Queue[pb.GenerateMuxRequest | None] = queue.Queue()
    replies = stub.GenerateMux(iter(out.get, None), timeout=180)

    def start(rid: str, prompt: list[int], replica: str = "r0", **params: Any) -> None:
        params = {"max_tokens": NEW, "ignore_eos": True, **params}
        req = pb.GenerateRequest(
            replica_id=replica,
            request_id=rid,
            prompt_token_ids=prompt,
            params=pb.SamplingParams(**params),
        )
        out.put(pb.GenerateMuxRequest(start=req))

    start("long", [0, 1, 2, 3], max_tokens=900)
    for i, p in enumerate(prompts):
        start(f"p{i}", p)
    bad = {"vocab": ([0, 99999], "r0", {}), "nope": ([0, 1, 2], "nope", {})}
    bad["huge"] = ([0, 1, 2], "small", {"max_tokens": 100})
    for rid, (p, replica, params) in bad.items():
        start(rid, p, replica, **params)
    tokens: dict[str, list[int]] = defaultdict(list)
    failed: dict[str, tuple[str, str]] = {}
    finished: set[str] = set()
    widest, cancelled, closed = 0, False, False
    for reply in replies:  # ends after the half-close, once every request ended
        widest = max(widest, len({e.request_id for e in reply.entries}))
        for e in reply.entries:
            if e.HasField("error"):
                failed[e.request_id] = (e.error.code, e.error.message)
            else:
                tokens[e.request_id].extend(e.chunk.token_ids)
                if e.chunk.finish_reason:
                    finished.add(e.request_id)
        if not cancelled and len(tokens["long"]) >= 3:
            assert _used(stub) > 0
            out.put(pb.GenerateMuxRequest(cancel=pb.GenerateMuxCancel(request_id="long")))
            cancelled = True
        ended = finished | failed.keys()
        if cancelled and not closed and ended >= {f"p{i}" for i in range(8)} | bad.keys():
            out.put(None)  # half-close: the stream ends when its requests have
            closed = True
    assert [tokens[f"p{i}"] for i in range(8)] == [hf_greedy(tiny_llama, p, NEW) for p in prompts]
    assert widest >= 2  # one message carried several requests' tokens
    assert "long" not in finished and len(tokens["long"]) < 900
    for rid, (p, replica, params) in bad.items():  # the per-request call's very status
        code, msg = _code(lambda p=p, r=replica, kw=params: generate(agent, p, r, **kw))
        assert failed[rid] == (code.name, msg) and code != grpc.StatusCode.OK
    deadline = time.monotonic() + 10
    while _used(stub) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _used(stub) == 0
