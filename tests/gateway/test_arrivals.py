"""Per-class arrivals per span: the recorder's spans and class rule, and the gateway's
`GET /admin/v1/arrivals` and `tessera_gateway_class_arrivals_total` after real requests."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tessera.gateway import arrivals, config, server
from tessera.workload import classes, live_classes, traces
from tests.gateway import helpers

C = "/v1/completions"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _fitted() -> live_classes.LiveClassifier:
    """Two classes: short prompts (4-12 tokens) and long ones (200-400)."""
    rng = random.Random(0)
    reqs = [traces.Request(0.0, rng.randint(4, 12), rng.randint(5, 30)) for _ in range(200)]
    reqs += [traces.Request(0.0, rng.randint(200, 400), rng.randint(5, 30)) for _ in range(200)]
    workload = classes.fit_classes(reqs, k=2, seed=0)
    return live_classes.fit(reqs, workload)


def test_spans_count_per_class_and_only_complete_ones_are_reported() -> None:
    clock = Clock()
    seen: list[str] = []
    rec = arrivals.ArrivalRecorder(span_s=10.0, keep_spans=3, clock=clock, on_arrival=seen.append)
    rec.set_classes(lambda p, m: "short" if p < 100 else "long", ["short", "long"])
    for p in (5, 6, 300):
        rec.record(p, None)
    clock.t += 10.0  # span 1
    rec.record(500, 64)
    clock.t += 4.0
    snap = rec.snapshot()
    assert snap["spans"] == [[2, 1]] and snap["current"] == [0, 1]
    assert snap["firstSpan"] == 0 and snap["currentElapsedSeconds"] == pytest.approx(4.0)
    assert seen == ["short", "short", "long", "long"]
    clock.t += 100.0  # long idle: only the last keep_spans spans remain, all contiguous
    snap = rec.snapshot()
    assert snap["spans"] == [[0, 0]] * 3 and snap["firstSpan"] == 11 - 3


def test_unknown_class_counts_as_unclassified() -> None:
    rec = arrivals.ArrivalRecorder(clock=Clock())
    assert rec.record(5, None) == arrivals.UNCLASSIFIED  # no rule yet
    rec.set_classes(lambda p, m: "other", ["a"])
    assert rec.record(5, None) == arrivals.UNCLASSIFIED
    assert rec.snapshot()["unclassified"] == 2 and rec.snapshot()["current"] == [0]


def test_live_class_router_uses_prompt_length_and_max_tokens() -> None:
    clf = _fitted()
    route = arrivals.live_class_router(clf, ["a", "b"])
    short, long = route(8, 0), route(300, 0)
    assert short != long
    assert route(8, 16) == short  # max_tokens set: still the short-prompt class here
    with pytest.raises(ValueError, match="class names"):
        arrivals.live_class_router(clf, ["a"])


def test_live_classes_file_round_trip_and_errors(tmp_path: Path) -> None:
    clf = _fitted()
    doc = json.loads(json.dumps(live_classes.to_json(clf, ["a", "b"])))
    back, names = live_classes.from_json(doc)
    assert (back, names) == (clf, ("a", "b"))
    with pytest.raises(ValueError, match="class names"):
        live_classes.to_json(clf, ["a"])
    with pytest.raises(ValueError, match="counts must be"):
        live_classes.from_json({**doc, "counts": doc["counts"][:-1]})
    with pytest.raises(ValueError, match="missing or malformed"):
        live_classes.from_json({k: v for k, v in doc.items() if k != "edges"})


@pytest.fixture
async def gw(tiny_llama: Path, tmp_path: Path) -> AsyncIterator[server.GatewayHandle]:
    """A gateway typing arrivals with a live classifier read from its file."""
    path = tmp_path / "live.json"
    path.write_text(json.dumps(live_classes.to_json(_fitted(), ["c0", "c1"])))
    h = await helpers.start(
        str(tiny_llama),
        config.ReplicaEndpoint("gone", helpers.dead_address()),
        arrival_span_s=0.5,
        live_classes_file=str(path),
    )
    yield h
    await h.stop()


async def test_a_bad_live_classes_file_fails_at_start(tiny_llama: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match=r"bad\.json: live classes"):
        await helpers.start(str(tiny_llama), live_classes_file=str(bad))


async def test_gateway_records_arrivals_per_class(
    gw: server.GatewayHandle, session: aiohttp.ClientSession
) -> None:
    clf = _fitted()
    names = ["c0", "c1"]
    short = names[clf.classify(8)]
    long = names[clf.classify(300)]
    body = {"model": helpers.MODEL, "max_tokens": 4}
    for prompt in ([7] * 8, [7] * 8, [7] * 300):
        status, _ = await helpers.post(session, gw.url + C, {**body, "prompt": prompt})
        assert status == 503  # no replica: still an arrival of demand
    bad, _ = await helpers.post(session, gw.url + C, {**body, "prompt": [7] * 2000})
    assert bad == 400  # rejected requests are not arrivals
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        async with session.get(gw.url + "/admin/v1/arrivals") as r:
            assert r.status == 200
            snap = await r.json()
        if sum(map(sum, snap["spans"])) == 3 or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.1)
    assert snap["classes"] == names and snap["spanSeconds"] == 0.5
    totals = [sum(col) for col in zip(*snap["spans"], strict=True)]
    want = [0, 0]
    want[names.index(short)] += 2
    want[names.index(long)] += 1
    assert totals == want
    async with session.get(gw.url + "/metrics") as r:
        text = await r.text()
    assert f'tessera_gateway_class_arrivals_total{{class="{short}"}} 2.0' in text
