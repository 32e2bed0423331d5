"""The gateway over HTTP without agents: every error path before a replica is contacted,
/v1/models, /health, /metrics and routes-file reloads."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tessera.gateway import config, replicas, server
from tests.gateway import helpers

C, CHAT = "/v1/completions", "/v1/chat/completions"


@pytest.fixture
async def gw(tiny_llama: Path) -> AsyncIterator[server.GatewayHandle]:
    h = await helpers.start(str(tiny_llama), config.ReplicaEndpoint("gone", helpers.dead_address()))
    yield h
    await h.stop()


async def test_errors_in_openai_format(
    gw: server.GatewayHandle, session: aiohttp.ClientSession
) -> None:
    base = {"model": helpers.MODEL, "prompt": "Once upon a time"}
    chat = {"model": helpers.MODEL, "messages": [{"role": "user", "content": "hi"}]}
    cases = [
        (C, None, b"{not json", 400, "invalid_json"),
        (C, None, b"[1, 2]", 400, "invalid_json"),
        (C, {**base, "max_tokens": 0}, None, 400, "invalid_value"),
        (C, {**base, "max_tokens": -3}, None, 400, "invalid_value"),
        (C, {**base, "temperature": -1}, None, 400, "invalid_value"),
        (C, {**base, "n": 17}, None, 400, "invalid_value"),
        (C, {**base, "prompt": [7] * 1024}, None, 400, "context_length_exceeded"),
        (C, {**base, "prompt": "a " * 1100}, None, 400, "context_length_exceeded"),
        (
            C,
            {**base, "prompt": [0] * 1000, "max_tokens": 100},
            None,
            400,
            "context_length_exceeded",
        ),
        (C, {**base, "prompt": [0, 512]}, None, 400, "invalid_value"),  # outside the vocab
        (C, {**base, "model": "gpt-4"}, None, 404, "model_not_found"),
        (C, {"prompt": "x"}, None, 400, "missing_required_parameter"),
        (CHAT, {"model": helpers.MODEL}, None, 400, "missing_required_parameter"),
        (CHAT, {**chat, "messages": [{"role": "user", "content": 7}]}, None, 400, "invalid_value"),
        (C, base, None, 503, "no_replica_ready"),  # valid, but the only replica is down
        (CHAT, chat, None, 503, "no_replica_ready"),
    ]
    for path, body, raw, status, code in cases:
        got_status, got = await helpers.post(session, gw.url + path, body, raw)
        assert (got_status, got["error"]["code"]) == (status, code), (body, raw, got)
        err = got["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
        expected_type = "server_error" if status >= 500 else "invalid_request_error"
        assert err["type"] == expected_type
    async with session.get(gw.url + "/nope") as r:
        assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
    requests = "tessera_gateway_requests_total"
    assert await helpers.metric(session, gw.url, requests, endpoint=C, status="400") == 11
    assert await helpers.metric(session, gw.url, requests, endpoint=C, status="503") == 1
    assert await helpers.metric(session, gw.url, requests, endpoint=C, status="404") == 1


async def test_models_health_metrics(
    gw: server.GatewayHandle, session: aiohttp.ClientSession
) -> None:
    async with session.get(gw.url + "/v1/models") as r:
        body = await r.json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == [helpers.MODEL]
    assert body["data"][0]["max_model_len"] == 1024
    async with session.get(gw.url + "/health") as r:
        assert r.status == 503
        health = await r.json()
    assert health["status"] == "unavailable" and not health["replicas"]["gone"]["ready"]
    assert "Describe failed" in health["replicas"]["gone"]["detail"]
    async with session.get(gw.url + "/metrics") as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    for name in (
        "tessera_gateway_requests_total",
        "tessera_gateway_time_to_first_token_seconds",
        "tessera_gateway_inter_token_latency_seconds",
        "tessera_gateway_request_duration_seconds",
        "tessera_gateway_in_flight_requests",
        "tessera_gateway_outstanding_tokens",
        "tessera_gateway_prompt_tokens_total",
        "tessera_gateway_generation_tokens_total",
        "tessera_gateway_replica_ready",
    ):
        assert f"# TYPE {name.removesuffix('_total')}" in text, name


async def test_routes_file_reloads_on_change(tiny_llama: Path, tmp_path: Path) -> None:
    path = tmp_path / "routes.json"
    first = {
        "model": helpers.MODEL,
        "modelPath": str(tiny_llama),
        "replicas": [{"id": "a", "address": helpers.dead_address()}],
    }
    path.write_text(json.dumps(first))
    h = await server.start_gateway(
        config.GatewayConfig("", "", port=0, routes_file=str(path), poll_interval_s=0.05)
    )
    try:
        assert h.model_name == helpers.MODEL
        assert [e.replica_id for e in h.service.replicas.endpoints] == ["a"]
        second = {
            **first,
            "replicas": [{"id": "b", "address": helpers.dead_address()}],
            "classShares": {"c": {"b": 1.0}},
            "classes": [{"name": "c", "inputTokens": 10, "outputTokens": 10}],
        }
        path.write_text("{broken")  # an invalid file is ignored; the previous routes stay
        os.utime(path, ns=(1, 1))  # a distinct mtime even on coarse clocks
        await h.refresh()
        assert [e.replica_id for e in h.service.replicas.endpoints] == ["a"]
        path.write_text(json.dumps(second))
        os.utime(path, ns=(2, 2))
        await h.refresh()
        assert [e.replica_id for e in h.service.replicas.endpoints] == ["b"]
        h.update_replicas([config.ReplicaEndpoint("c", helpers.dead_address())])
        assert [e.replica_id for e in h.service.replicas.endpoints] == ["c"]
    finally:
        await h.stop()


async def test_a_changed_routes_file_applies_between_polls(
    tiny_llama: Path, tmp_path: Path
) -> None:
    """A drop's donors leave the routes before they drain: the file is checked on its own
    short period, not only at the (much longer) Describe poll."""
    path = tmp_path / "routes.json"
    doc = {"model": helpers.MODEL, "modelPath": str(tiny_llama)}
    path.write_text(
        json.dumps({**doc, "replicas": [{"id": "a", "address": helpers.dead_address()}]})
    )
    h = await server.start_gateway(
        config.GatewayConfig(
            "", "", port=0, routes_file=str(path), poll_interval_s=30.0, routes_check_s=0.01
        )
    )
    try:
        path.write_text(
            json.dumps({**doc, "replicas": [{"id": "b", "address": helpers.dead_address()}]})
        )
        os.utime(path, ns=(3, 3))
        for _ in range(200):
            if [e.replica_id for e in h.service.replicas.endpoints] == ["b"]:
                break
            await asyncio.sleep(0.01)
        assert [e.replica_id for e in h.service.replicas.endpoints] == ["b"]
    finally:
        await h.stop()


async def test_body_too_large_is_413(tiny_llama: Path, session: aiohttp.ClientSession) -> None:
    h = await helpers.start(str(tiny_llama), max_body_bytes=1024)
    try:
        body = {"model": helpers.MODEL, "prompt": "x" * 2000}
        status, got = await helpers.post(session, h.url + C, body)
        assert (status, got["error"]["code"]) == (413, "body_too_large")
    finally:
        await h.stop()


def test_cli_flags_build_a_config() -> None:
    import argparse

    from tessera.cli import gateway_cmd

    parser = argparse.ArgumentParser()
    gateway_cmd.register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "gateway",
            "--model-name",
            "m",
            "--model-path",
            "/m",
            "--replica",
            "r0=h:1",
            "--replica",
            "r1=h:2",
            "--port",
            "0",
        ]
    )
    assert args.func is gateway_cmd._run
    assert args.no_kv_dispatch is False  # KV-owner-first dispatch by default
    assert parser.parse_args(["gateway", "--no-kv-dispatch"]).no_kv_dispatch is True
    assert [config.parse_replica(r) for r in args.replica] == [
        config.ReplicaEndpoint("r0", "h:1"),
        config.ReplicaEndpoint("r1", "h:2"),
    ]
    with pytest.raises(ValueError, match="ID=HOST:PORT"):
        config.parse_replica("h:1")
    with pytest.raises(ValueError, match="model_name and model_path"):
        config.GatewayConfig("", "")
    with pytest.raises(ValueError, match="duplicate"):
        config.GatewayConfig("m", "/m", replicas=(config.parse_replica("a=h:1"),) * 2)
    assert gateway_cmd._run(parser.parse_args(["gateway", "--model-name", "m"])) == 1


async def test_settle_before_the_first_poll(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry point's heap settle (`before_ready`) runs before the poll that can make
    `/health` say OK, not under the first requests."""
    order: list[str] = []
    real = replicas.ReplicaSet.poll_once

    async def poll_once(self: replicas.ReplicaSet) -> None:
        order.append("poll")
        await real(self)

    monkeypatch.setattr(replicas.ReplicaSet, "poll_once", poll_once)
    cfg = config.GatewayConfig(
        helpers.MODEL,
        str(tiny_llama),
        port=0,
        replicas=(config.ReplicaEndpoint("gone", helpers.dead_address()),),
    )
    gw = await server.start_gateway(cfg, before_ready=lambda: order.append("settle"))
    try:
        assert order[:2] == ["settle", "poll"]
    finally:
        await gw.stop()
