"""The operator runs the overload loop (issue 30): KMock, two agent processes, a gateway process.

`spec.policies.overload.enabled`, two whole replicas with 8-page KV pools. The gateway
runs as its own process from the routes ConfigMap (mirrored into a file, as the kubelet
mounts it); the operator reads its queued requests from `GET /admin/v1/load`. A burst
of greedy completions (each needs its whole pool) makes the operator drop layers: the
`Overloaded` condition turns True `LayersDropped`, `OverloadDropped` is posted; when
the burst is served it restores (`OverloadRestored`, False `WholeReplicas`). Every
completion returns transformers' greedy text.

The first operator is stopped in the middle of a drop (after the donor shifted, before
the head did: the head whole and paused, a stage of its replica on the donor's agent);
a new operator, with nothing in memory, converges from what the agents report
(`OverloadConverged`), and every request of that burst still completes.

The gateway runs with API keys on and an admin token (`gateway_process`): the requests
carry a user's key, the operator's pulls of `/admin/v1/load` carry its admin token
(`gateway_admin_token`), without which the gateway answers 401.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes import client
from tokenizers import Tokenizer

from tessera.cli import local_agents
from tessera.policies.overload import steps as overload_steps
from tests.conftest import hf_greedy
from tests.operator.conftest import (
    GROUP,
    PLURAL,
    VERSION,
    condition,
    custom,
    events,
    get_sd,
    wait_for,
)
from tests.operator.test_operator_lifecycle import blocks, manifest, ready, refs

pytestmark = pytest.mark.slow
Start = Callable[..., list[local_agents.AgentProcess]]
WHOLE = [
    {"name": f"r{i}", "stages": [{"agent": f"agent-{i}", "device": "cpu:0", "layers": [0, 8]}]}
    for i in range(2)
]
R0, R1 = "default.ovl.r0.g1", "default.ovl.r1.g1"
PROMPTS = [[0, *range(300 + 7 * i, 340 + 7 * i)] for i in range(3)]  # 41 tokens each
NEW = 80  # 41 + 80 tokens: 8 pages of 16, a whole pool each


class Mirror:
    """The routes ConfigMap written into a file whenever it changes (the kubelet's part)."""

    def __init__(self, kube: client.ApiClient, name: str, path: Path) -> None:
        self.core, self.name, self.path = client.CoreV1Api(kube), name, path
        self._stop = threading.Event()
        self._seen = ""
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sync(self) -> bool:
        try:
            cm = self.core.read_namespaced_config_map(f"{self.name}-gateway-routes", "default")
        except client.ApiException:
            return False
        text = (cm.data or {}).get("routes.json", "")
        if text and text != self._seen:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(text)
            os.replace(tmp, self.path)
            self._seen = text
        return bool(self._seen)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.sync()

    def start(self) -> Mirror:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


API_KEY, ADMIN_TOKEN = "sk-loops", "adm-loops"  # a user's key; the operator's token


@pytest.fixture
def gateway_process() -> Iterator[Callable[..., str]]:
    """`start(routes_file, model_path, keys=False)`: a `tessera gateway` process (with
    `keys`: API keys on, `API_KEY`, and the operator's `ADMIN_TOKEN`); returns its URL."""
    procs: list[subprocess.Popen[str]] = []

    def start(routes: Path, model: Path, keys: bool = False) -> str:
        cmd = [sys.executable, "-m", "tessera.cli.main", "gateway", "--routes", str(routes)]
        if keys:
            (routes.parent / "api-keys").write_text(f"loops {API_KEY}\n")
            (routes.parent / "admin-token").write_text(f"{ADMIN_TOKEN}\n")
            cmd += ["--api-keys-file", str(routes.parent / "api-keys")]
            cmd += ["--admin-token-file", str(routes.parent / "admin-token")]
        cmd += ["--model-name", "tiny-llama", "--model-path", str(model)]
        cmd += ["--port", "0", "--poll-interval", "0.2"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(p)
        out = p.stdout
        assert out is not None
        seen = []
        for line in out:
            seen.append(line)
            m = re.search(r"gateway listening on (http://\S+)", line)
            if m:
                threading.Thread(target=lambda: sum(1 for _ in out), daemon=True).start()
                return m.group(1)
        raise AssertionError("gateway exited: " + "".join(seen[-20:]))

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


async def _burst(url: str, n: int, new: int = NEW, strict: bool = True) -> list[str]:
    """n concurrent greedy completions of the prompts in turn; their texts ("" for a
    failed one when not `strict`)."""

    async def one(session: aiohttp.ClientSession, i: int) -> str:
        body = {
            "model": "tiny-llama",
            "prompt": PROMPTS[i % len(PROMPTS)],
            "max_tokens": new,
            "temperature": 0,
            "ignore_eos": True,
        }
        auth = {"Authorization": f"Bearer {API_KEY}"}
        async with session.post(url + "/v1/completions", json=body, headers=auth) as r:
            if not strict and r.status != 200:
                return ""
            assert r.status == 200, await r.text()
            doc: dict[str, Any] = await r.json()
            return str(doc["choices"][0]["text"])

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        return list(await asyncio.gather(*(one(session, i) for i in range(n))))


def _serving(url: str) -> bool:
    """The gateway routes both replicas and one answers."""
    try:
        got = asyncio.run(_burst(url, 1, new=1, strict=False))
    except aiohttp.ClientError:
        return False
    return bool(got and got[0])


def _in_thread(url: str, n: int) -> tuple[threading.Thread, list[list[str]]]:
    box: list[list[str]] = []
    t = threading.Thread(target=lambda: box.append(asyncio.run(_burst(url, n))), daemon=True)
    t.start()
    return t, box


def _overloaded(kube: client.ApiClient, status: str) -> dict[str, Any] | None:
    obj = get_sd(kube, "ovl")
    return obj if condition(obj, "Overloaded").get("status") == status else None


def _said(kube: client.ApiClient) -> str:
    sd = get_sd(kube, "ovl") or {}
    return f"status {sd.get('status')}; events {events(kube, 'ovl')}"


def test_operator_drops_and_restores_and_survives_a_restart_mid_drop(
    agents_factory: Start,
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
    gateway_process: Callable[..., str],
    tmp_path: Path,
) -> None:
    tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
    want = [tok.decode(hf_greedy(tiny_llama, p, NEW), skip_special_tokens=True) for p in PROMPTS]
    procs = agents_factory(2)
    routes = tmp_path / "routes.json"
    routes.write_text('{"replicas": []}')
    url = gateway_process(routes, tiny_llama, keys=True)
    doc = manifest("ovl", tiny_llama, WHOLE)
    doc["spec"]["layout"]["kvCacheBytes"] = 1 << 20  # 8 pages of 16 tokens per replica
    doc["spec"]["policies"] = {"overload": {"enabled": True}}

    # the first operator stops itself after the donor's drop shift, before the head's
    shifted, killed = threading.Event(), threading.Event()

    async def crash_mid_drop(st: overload_steps.Step) -> None:
        if isinstance(st, overload_steps.Shift) and st.op == "drop" and st.becomes.stage_index:
            shifted.set()
            while not killed.is_set():
                await asyncio.sleep(0.05)
            raise RuntimeError("operator stopped mid-drop")

    first = start_operator(
        refs(procs),
        overload_step_hook=crash_mid_drop,
        gateway_admin_url=url,
        gateway_admin_token=ADMIN_TOKEN,
    )
    custom(kube).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, doc)
    wait_for("Ready=True", lambda: ready(kube, "ovl"), timeout=180)
    mirror = Mirror(kube, "ovl", routes)
    wait_for("routes ConfigMap", mirror.sync)
    mirror.start()
    try:
        wait_for("the gateway serving", lambda: _serving(url), timeout=60, every=0.5)
        # burst 1: the first operator starts a drop and is stopped in its middle (a
        # burst served before a tick saw its queue is followed by another, at most 4)
        for _ in range(4):
            t1, got1 = _in_thread(url, 8)
            while t1.is_alive() and not shifted.is_set():
                t1.join(0.1)
            if shifted.is_set():
                break
            assert got1 and got1[0] == [want[i % 3] for i in range(8)]
        else:
            raise AssertionError("no drop started; " + _said(kube))
        killed.set()  # the tick raises where it stands, as a killed process would stop
        first.stop(timeout=60)
        held = blocks(procs[0]) + blocks(procs[1])
        later = [b for b in held if b[1] == 1]  # the donor shifted, the head did not
        assert len(later) == 1 and (later[0][0], 0, 0, 8) in held and later[0][2:] == (4, 8), held
        # nothing in memory
        start_operator(refs(procs), gateway_admin_url=url, gateway_admin_token=ADMIN_TOKEN)
        t1.join(300)
        assert got1 and got1[0] == [want[i % 3] for i in range(8)]
        wait_for("converged", lambda: "OverloadConverged" in dict(events(kube, "ovl")), 60)
        wait_for(
            "whole replicas",
            lambda: blocks(procs[0]) + blocks(procs[1]) == [(R0, 0, 0, 8), (R1, 0, 0, 8)],
            timeout=120,
        )
        wait_for("Ready=True", lambda: ready(kube, "ovl"), timeout=60)

        # burst 2: the new operator drops, then restores once the burst is served
        t2, got2 = _in_thread(url, 8)
        try:
            obj = wait_for("Overloaded=True", lambda: _overloaded(kube, "True"), timeout=120)
        except AssertionError:
            raise AssertionError("no drop; " + _said(kube)) from None
        c = condition(obj, "Overloaded")
        assert c["reason"] == "LayersDropped", c
        t2.join(300)
        assert got2 and got2[0] == [want[i % 3] for i in range(8)]
        obj = wait_for("Overloaded=False", lambda: _overloaded(kube, "False"), timeout=120)
        assert condition(obj, "Overloaded")["reason"] == "WholeReplicas"
        reasons = [r for r, _ in events(kube, "ovl")]
        assert "OverloadDropped" in reasons and "OverloadRestored" in reasons, reasons
        assert blocks(procs[0]) + blocks(procs[1]) == [(R0, 0, 0, 8), (R1, 0, 0, 8)]
    finally:
        mirror.stop()
