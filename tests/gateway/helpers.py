"""Shared helpers of the gateway tests: start a gateway, post JSON, read SSE and metrics."""

from __future__ import annotations

import json
import re
import socket
from typing import Any

import aiohttp

from tessera.bench import client
from tessera.gateway import config, server

MODEL = "tiny"


async def start(
    model_path: str, *replicas: config.ReplicaEndpoint, **kw: Any
) -> server.GatewayHandle:
    kw.setdefault("poll_interval_s", 0.2)
    cfg = config.GatewayConfig(MODEL, model_path, port=0, replicas=tuple(replicas), **kw)
    return await server.start_gateway(cfg)


def dead_address() -> str:
    """host:port where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def post(
    session: aiohttp.ClientSession, url: str, body: Any, raw: bytes | None = None
) -> tuple[int, Any]:
    data = raw if raw is not None else json.dumps(body).encode()
    async with session.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json()


async def post_stream(session: aiohttp.ClientSession, url: str, body: Any) -> list[Any]:
    """The decoded `data:` events of an SSE response ("[DONE]" kept as a string)."""
    async with session.post(url, json={**body, "stream": True}) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith("text/event-stream")
        return [ev async for ev in client.events(r.content)]


def streamed_text(events: list[Any]) -> str:
    out = []
    for ev in events:
        if isinstance(ev, dict):
            for ch in ev.get("choices", []):
                out.append(ch["delta"].get("content") or "" if "delta" in ch else ch["text"])
    return "".join(out)


async def metric(session: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (0 when absent)."""
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^(\w+)(\{[^}]*\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total
