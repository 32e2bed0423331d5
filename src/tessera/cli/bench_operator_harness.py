"""The cluster a `tessera bench ... --via operator` run serves through, in one process.

`Cluster` starts the gateway (`tessera.gateway.server`, in the caller's event loop,
reading a routes file), the test API server (KMock, a dev dependency) and the operator
(in threads; `OperatorConfig` from the agents given and the caller's extra fields, the
gateway's admin URL filled in, the checkpoint's folder the allowed model root, hostPath
allowed), creates one ServingDeployment, waits for it Ready, mirrors
its routes ConfigMap into the gateway's routes file (the kubelet's part) and waits for the
gateway to route its replicas. Then the caller streams greedy requests to the gateway
(`stream`, one `Req` each), patches the deployment (`patch`), reads it (`deployment`) and
its events (`events`). Callers: `bench_overload_operator`, `bench_scaling_operator`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp

from tessera.cli import local_agents

GROUP, VERSION, PLURAL = "serving.tessera.dev", "v1alpha1", "servingdeployments"


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


async def get(s: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    async with s.get(url) as r:
        if r.status == 404:
            return None
        r.raise_for_status()
        doc: dict[str, Any] = await r.json()
        return doc


async def wait(what: str, check: Callable[[], Awaitable[Any]], timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await check()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


async def _mirror(
    s: aiohttp.ClientSession, api: str, name: str, path: Path, stop: asyncio.Event
) -> None:
    url = f"{api}/api/v1/namespaces/default/configmaps/{name}-gateway-routes"
    seen = ""
    while not stop.is_set():
        cm = await get(s, url)
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


async def stream(s: aiohttp.ClientSession, url: str, r: Req) -> None:
    """Send `r` to the gateway at `url` (streamed, greedy) and record its timings."""
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


def pct(values: list[float], q: float) -> float:
    from tessera.cli import bench_serve

    return bench_serve._pct(values, q)


class Event(NamedTuple):
    name: str
    reason: str
    message: str
    time: str  # RFC 3339


class Cluster:
    """`async with Cluster(...) as c:` (module docstring); `c.s` is the HTTP session,
    `c.gateway` the gateway's URL."""

    def __init__(
        self,
        agents: list[local_agents.AgentProcess],
        model: Path,
        manifest: dict[str, Any],
        work: Path,
        replicas: int,
        **operator: Any,
    ) -> None:
        self.agents, self.model, self.manifest, self.work = agents, model, manifest, work
        self.replicas, self.operator = replicas, operator
        self.name: str = manifest["metadata"]["name"]
        self._stop = asyncio.Event()

    async def __aenter__(self) -> Cluster:
        from tessera.control import agents as op_agents
        from tessera.gateway import config as gw_config
        from tessera.gateway import server as gw_server
        from tessera.policies import admission
        from tessera_operator import config as op_config
        from tessera_operator.testing import background

        routes = self.work / "routes.json"
        routes.write_text('{"replicas": []}')
        self._gw = await gw_server.start_gateway(
            gw_config.GatewayConfig(
                model_name="tiny-llama",
                model_path=str(self.model),
                port=0,
                routes_file=str(routes),
                poll_interval_s=0.2,
            )
        )
        self.gateway: str = self._gw.url
        self._srv = background.ApiServerThread().start()
        self.api: str = self._srv.url
        refs = tuple(op_agents.AgentRef(f"agent-{i}", a.address) for i, a in enumerate(self.agents))
        # the checkpoint lies in a temporary folder (the model root), mounted as a hostPath
        roots = admission.Limits((str(self.model.parent.resolve()),), allow_host_path=True)
        cfg = op_config.OperatorConfig(
            agents=refs,
            api_server=self.api,
            gateway_admin_url=self.gateway,
            **({"admission": roots} | self.operator),
        )
        self._op = await asyncio.to_thread(lambda: background.OperatorThread(cfg).start())
        self.s = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900))
        self.url = f"{self.api}/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}/{self.name}"
        try:
            async with self.s.post(self.url.rsplit("/", 1)[0], json=self.manifest) as r:
                r.raise_for_status()

            async def ready() -> bool:
                conds = ((await self.deployment()).get("status") or {}).get("conditions") or []
                return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

            await wait("the deployment Ready", ready)
            self._mirror = asyncio.create_task(
                _mirror(self.s, self.api, self.name, routes, self._stop)
            )

            async def serving() -> bool:
                admin = await get(self.s, self.gateway + "/admin/v1/routes") or {}
                return len(admin.get("replicas") or []) == self.replicas

            await wait(f"the gateway routing {self.replicas} replicas", serving)
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._close()

    async def _close(self) -> None:
        self._stop.set()
        if hasattr(self, "_mirror"):
            await self._mirror
        await self.s.close()
        await asyncio.to_thread(self._op.stop, 60)
        self._srv.stop()
        await self._gw.stop()

    async def deployment(self) -> dict[str, Any]:
        return await get(self.s, self.url) or {}

    async def patch(self, doc: dict[str, Any]) -> None:
        """A JSON merge patch of the deployment (as `kubectl patch --type merge`)."""
        headers = {"Content-Type": "application/merge-patch+json"}
        async with self.s.patch(self.url, data=json.dumps(doc), headers=headers) as r:
            r.raise_for_status()

    async def events(self) -> list[Event]:
        """The deployment's events, oldest first (by time, to the second: the API server
        lists them in no set order; tell new ones by `name`)."""
        found = await get(self.s, f"{self.api}/api/v1/namespaces/default/events") or {}
        out = [
            Event(
                (e.get("metadata") or {}).get("name", ""),
                e.get("reason", ""),
                e.get("message", ""),
                e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or "",
            )
            for e in found.get("items") or []
            if (e.get("involvedObject") or {}).get("name") == self.name
        ]
        return sorted(out, key=lambda e: e.time)
