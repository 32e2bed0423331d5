"""`tessera bench overload --via operator`: the same replay, served the way a cluster serves it.

One run (policy off or on) on fresh agents: the test API server (KMock, a dev
dependency) and the operator in threads of this process, a ServingDeployment of 4 whole
replicas (`kvCacheBytes` = the bench's pool) with `spec.policies.overload.enabled` as
asked, the gateway (`tessera.gateway.server`, in this process's event loop) reading the
routes ConfigMap mirrored into a file (the kubelet's part), and the replay sent to the
gateway's `/v1/completions` (streamed, greedy, token ids as the prompt). The operator
ticks the overload loop every `--tick-ms` and reads the gateway's calls over
`GET /admin/v1/load`. Drops and restores are counted from the deployment's events
(`OverloadDropped` / `OverloadRestored`); exchange and pause times from the loop's
`OverloadShifted` events. Output: what `bench_overload._replay` returns, with each
request's text instead of its tokens. Caller: `bench_overload.run`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tessera.cli import local_agents

GROUP, VERSION, PLURAL = "serving.tessera.dev", "v1alpha1", "servingdeployments"
NAME = "ovl"


@dataclass
class Req:
    i: int
    prompt: list[int]
    max_tokens: int
    sent: float = 0.0
    first: float | None = None
    last: float | None = None
    text: list[str] = field(default_factory=list)
    chunks: int = 0
    done: bool = False


def manifest(model: Path, kv_bytes: int, policy: bool) -> dict[str, Any]:
    replicas = [
        {"name": f"r{i}", "stages": [{"agent": f"agent-{i}", "device": "cpu:0", "layers": [0, 8]}]}
        for i in range(4)
    ]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ServingDeployment",
        "metadata": {"name": NAME, "namespace": "default"},
        "spec": {
            "model": {"name": "tiny-llama", "path": str(model)},
            "layout": {"mode": "explicit", "kvCacheBytes": kv_bytes, "replicas": replicas},
            "policies": {"overload": {"enabled": policy}},
        },
    }


async def _get(s: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    async with s.get(url) as r:
        if r.status == 404:
            return None
        r.raise_for_status()
        doc: dict[str, Any] = await r.json()
        return doc


async def _wait(what: str, check: Any, timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await check()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


async def _mirror(s: aiohttp.ClientSession, api: str, path: Path, stop: asyncio.Event) -> None:
    url = f"{api}/api/v1/namespaces/default/configmaps/{NAME}-gateway-routes"
    seen = ""
    while not stop.is_set():
        cm = await _get(s, url)
        text = ((cm or {}).get("data") or {}).get("routes.json", "")
        if text and text != seen:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
            seen = text
        try:
            await asyncio.wait_for(stop.wait(), 0.1)
        except TimeoutError:
            pass


async def _stream(s: aiohttp.ClientSession, url: str, r: Req) -> None:
    body = {
        "model": "tiny-llama",
        "prompt": r.prompt,
        "max_tokens": r.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    r.sent = time.perf_counter()
    async with s.post(url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            return
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            ev = json.loads(line[len(b"data: ") :])
            if "error" in ev:
                return
            now = time.perf_counter()
            for ch in ev.get("choices") or []:
                if ch.get("text"):
                    r.first = r.first or now
                    r.last = now
                    r.text.append(ch["text"])
                if ch.get("finish_reason") == "length":
                    r.done = True


def _pct(values: list[float], q: float) -> float:
    from tessera.cli import bench_serve

    return bench_serve._pct(values, q)


async def _replay(
    agents: list[local_agents.AgentProcess],
    model: Path,
    reqs: list[tuple[float, int, int]],
    prompts: list[list[int]],
    kv_bytes: int,
    policy: bool,
    tick_s: float,
    work: Path,
) -> dict[str, Any]:
    from tessera.gateway import config as gw_config
    from tessera.gateway import server as gw_server
    from tessera_operator import agents as op_agents
    from tessera_operator import config as op_config
    from tessera_operator.testing import background

    routes = work / "routes.json"
    routes.write_text('{"replicas": []}')
    gw = await gw_server.start_gateway(
        gw_config.GatewayConfig(
            model_name="tiny-llama",
            model_path=str(model),
            port=0,
            routes_file=str(routes),
            poll_interval_s=0.2,
        )
    )
    srv = background.ApiServerThread().start()
    refs = tuple(op_agents.AgentRef(f"agent-{i}", a.address) for i, a in enumerate(agents))
    cfg = op_config.OperatorConfig(
        agents=refs,
        api_server=srv.url,
        resync_seconds=10.0,  # the operator's default
        overload_tick_seconds=tick_s,
        gateway_admin_url=gw.url,
    )
    op = await asyncio.to_thread(lambda: background.OperatorThread(cfg).start())
    stop = asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=900)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as s:
            base = f"{srv.url}/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}"
            async with s.post(base, json=manifest(model, kv_bytes, policy)) as r:
                r.raise_for_status()

            async def ready() -> bool:
                obj = await _get(s, f"{base}/{NAME}") or {}
                conds = (obj.get("status") or {}).get("conditions") or []
                return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

            await _wait("the deployment Ready", ready)
            mirror = asyncio.create_task(_mirror(s, srv.url, routes, stop))

            async def serving() -> bool:
                admin = await _get(s, gw.url + "/admin/v1/routes") or {}
                return len(admin.get("replicas") or []) == 4

            await _wait("the gateway routing 4 replicas", serving)
            rs = [Req(i, prompts[i], out) for i, (_, _, out) in enumerate(reqs)]
            start = time.perf_counter()

            async def one(r: Req) -> None:
                await asyncio.sleep(max(0.0, reqs[r.i][0] - (time.perf_counter() - start)))
                await _stream(s, gw.url, r)

            await asyncio.gather(*(one(r) for r in rs))
            wall = time.perf_counter() - start

            async def whole() -> bool:  # the loop restores once the burst is served
                obj = await _get(s, f"{base}/{NAME}") or {}
                return not ((obj.get("status") or {}).get("overload") or {}).get("groups")

            await _wait("whole replicas again", whole, timeout=120)
            url = f"{srv.url}/api/v1/namespaces/default/events"
            found = await _get(s, url) or {}
            items = [
                (e.get("reason", ""), e.get("message", ""))
                for e in found.get("items") or []
                if (e.get("involvedObject") or {}).get("name") == NAME
            ]
            stop.set()
            await mirror
    finally:
        stop.set()
        await asyncio.to_thread(op.stop, 60)
        srv.stop()
        await gw.stop()
    ttft = [r.first - r.sent for r in rs if r.first is not None]
    tpot = [
        (r.last - r.first) / (r.max_tokens - 1)
        for r in rs
        if r.first is not None and r.last is not None and r.max_tokens > 1
    ]
    shifted = [m for reason, m in items if reason == "OverloadShifted"]
    return {
        "requests": rs,
        "wall_s": wall,
        "p99_ttft_ms": _pct(ttft, 99) * 1e3,
        "p50_ttft_ms": _pct(ttft, 50) * 1e3,
        "p50_tpot_ms": _pct(tpot, 50) * 1e3,
        "lost": sum(not r.done for r in rs),
        "drops": sum(reason == "OverloadDropped" for reason, _ in items),
        "restores": sum(reason == "OverloadRestored" for reason, _ in items),
        "fallbacks": sum(reason == "DropInsufficient" for reason, _ in items),
        "exchange_ms": sum(_ms(m, "exchange") for m in shifted),
        "paused_ms": sum(_ms(m, "paused") for m in shifted),
        "events": [f"{r}: {m}" for r, m in items if r.startswith(("Overload", "Drop"))],
    }


def _ms(message: str, key: str) -> float:
    m = re.search(rf"{key} ([0-9.]+) ms", message)
    return float(m.group(1)) if m else 0.0


def run_once(
    model: Path,
    reqs: list[tuple[float, int, int]],
    prompts: list[list[int]],
    kv_bytes: int,
    policy: bool,
    tick_s: float,
) -> dict[str, Any]:
    """One replay on 4 fresh agents (module docstring)."""
    agents = [
        local_agents.start_agent(f"op-{'on' if policy else 'off'}-{i}", "cpu:1x256MiB", 1)
        for i in range(4)
    ]
    try:
        with tempfile.TemporaryDirectory(prefix="tessera-overload-op-") as tmp:
            return asyncio.run(
                _replay(agents, model, reqs, prompts, kv_bytes, policy, tick_s, Path(tmp))
            )
    finally:
        for a in agents:
            local_agents.stop_agent(a)
