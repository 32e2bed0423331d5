"""The cluster a `tessera bench ... --via operator` run serves through, in one process.

`Cluster` starts, each as its own process as on a cluster, the gateway (`tessera gateway`,
reading a routes file, with the admin token the operator's routes push needs;
`kv_dispatch=False` gives it the least-outstanding router, the rule `tessera bench overload`'s
replay routes by), the test API server (KMock, a dev dependency) and the operator (`tessera
operator` against it: the agents given, the caller's tick and resync periods, the gateway's
admin URL and token, the checkpoint's folder the allowed model root, hostPath allowed),
creates one ServingDeployment, waits for it Ready, mirrors its routes ConfigMap into the
gateway's routes file (the kubelet's part) and waits for the gateway to route its replicas.
Then the caller streams greedy requests to the gateway (`tessera.bench.client` over
`Cluster.s`), patches the deployment (`patch`), reads it (`deployment`) and its events
(`events`). Callers: `bench_overload_operator`, `bench_scaling_operator`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp

from tessera.bench import client, deployment
from tessera.cli import local_agents

GROUP, VERSION, PLURAL = deployment.GROUP, deployment.VERSION, deployment.PLURAL


ADMIN_TOKEN = "bench-admin-token"  # the gateway's and the operator's (its routes push needs one)


async def get(
    s: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> dict[str, Any] | None:
    async with s.get(url, headers=headers) as r:
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


class Event(NamedTuple):
    name: str
    reason: str
    message: str
    time: str  # RFC 3339


def _spawn(cmd: list[str], pattern: str, what: str) -> tuple[subprocess.Popen[str], str]:
    """Start `cmd` (its stdin a pipe: closing it, or this process dying, ends the API
    server's child) and return it with the URL its output names (`pattern`'s group 1);
    its output is drained in a thread from then on."""
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    seen: list[str] = []
    out = proc.stdout
    for line in out:
        seen.append(line)
        m = re.search(pattern, line)
        if m:
            threading.Thread(target=lambda: sum(1 for _ in out), daemon=True).start()
            return proc, m.group(1)
    raise RuntimeError(f"{what} exited: " + "".join(seen[-20:]))


# the test API server (KMock) as its own process, until its stdin closes
_API = (
    "import sys; from tessera_operator.testing import background as b; "
    "s = b.ApiServerThread().start(); print('api server at', s.url, flush=True); "
    "sys.stdin.read(); s.stop()"
)
_FLAGS = {
    "resync_seconds": "--resync",
    "overload_tick_seconds": "--overload-tick",
    "scaling_tick_seconds": "--scaling-tick",
}


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
        kv_dispatch: bool = True,
        api_nice: int = 0,
        **operator: float,
    ) -> None:
        unknown = set(operator) - set(_FLAGS)
        if unknown:
            raise ValueError(f"operator settings not passed on: {sorted(unknown)}")
        self.agents, self.model, self.manifest, self.work = agents, model, manifest, work
        self.replicas, self.operator, self.kv_dispatch = replicas, operator, kv_dispatch
        self.api_nice = api_nice  # the API server's niceness (a cluster's runs elsewhere)
        self.name: str = manifest["metadata"]["name"]
        self._stop = asyncio.Event()
        self._procs: list[subprocess.Popen[str]] = []

    async def __aenter__(self) -> Cluster:
        routes = self.work / "routes.json"
        routes.write_text('{"replicas": []}')
        token = self.work / "admin-token"
        token.write_text(ADMIN_TOKEN + "\n")
        main = [sys.executable, "-m", "tessera.cli.main"]
        try:
            gw_cmd = [*main, "gateway", "--routes", str(routes), "--model-name", "tiny-llama"]
            gw_cmd += ["--model-path", str(self.model), "--port", "0", "--poll-interval", "0.2"]
            gw_cmd += ["--admin-token-file", str(token)]
            if not self.kv_dispatch:
                gw_cmd += ["--no-kv-dispatch"]
            gw, self.gateway = await asyncio.to_thread(
                _spawn, gw_cmd, r"gateway listening on (http://\S+)", "the gateway"
            )
            self._procs.append(gw)
            api, self.api = await asyncio.to_thread(
                _spawn, [sys.executable, "-c", _API], r"api server at (\S+)", "the API server"
            )
            self._procs.append(api)
            if api_nice := self.api_nice:
                local_agents.renice_threads(api.pid, api_nice)
            # the checkpoint lies in a temporary folder (the model root), mounted as a hostPath
            cmd = [*main, "operator", "--api-server", self.api, "-n", "default", "--quiet"]
            cmd += ["--gateway-admin-url", self.gateway, "--allow-host-path"]
            cmd += ["--gateway-admin-token-file", str(token)]
            cmd += ["--allowed-model-root", str(self.model.parent.resolve())]
            for i, a in enumerate(self.agents):
                cmd += ["--agent", f"agent-{i}={a.address}"]
            for key, value in self.operator.items():
                cmd += [_FLAGS[key], str(value)]
            self._procs.append(
                subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, text=True
                )
            )
            self.s = client.session(900.0)  # no cap on connections (client.session)
            self.url = f"{self.api}/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}/{self.name}"
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
                auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
                admin = await get(self.s, self.gateway + "/admin/v1/routes", auth) or {}
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
        if hasattr(self, "s"):
            await self.s.close()
        for p in reversed(self._procs):  # the operator first, the gateway last
            if p.stdin is not None:
                p.stdin.close()
            p.terminate()
        for p in self._procs:
            try:
                await asyncio.to_thread(p.wait, 60)
            except subprocess.TimeoutExpired:
                p.kill()

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
