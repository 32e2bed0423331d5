"""The operator's autoscaler resizing an auto layout (issue 32): KMock, two agent processes
with no host cache, a gateway process.

`layout: auto` plans one replica per agent; `spec.scaling` has min 1, max 2. Calm, with no
host cache room to put a replica to sleep in, the autoscaler lowers
`status.autoscaling.desiredReplicas` and the reconcile removes one replica. Load (a TTFT
SLO of 1 ms, so every request's TTFT is over it) makes it raise the count again: the
reconcile adds a replica, sourced from the peer that holds the model (its
`status.replicaSources` entry), and every request sent meanwhile completes with
transformers' greedy text. Calm again removes it. The resync timer is an hour: every
resize is planned by the reconcile pass the autoscale tick runs when the count changes.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tokenizers import Tokenizer

from tessera.cli import local_agents
from tests.conftest import hf_greedy
from tests.operator.conftest import GROUP, VERSION, create, events, get_sd, wait_for
from tests.operator.test_operator_autoscale import NEW, PROMPT, _burst, _serving
from tests.operator.test_operator_lifecycle import blocks, refs
from tests.operator.test_operator_overload_loop import Mirror, gateway_process

pytestmark = pytest.mark.slow
_ = gateway_process  # the fixture, imported for this module


@pytest.fixture
def plain_agents() -> Iterator[list[local_agents.AgentProcess]]:
    procs = [local_agents.start_agent(f"agent-{i}", "cpu:1x512MiB", 1) for i in range(2)]
    yield procs
    for p in procs:
        local_agents.stop_agent(p)


def _status(kube: client.ApiClient) -> dict[str, Any]:
    return dict((get_sd(kube, "grow") or {}).get("status") or {})


def _planned(kube: client.ApiClient) -> list[str]:
    st = _status(kube)
    return [str(r["replicaId"]) for r in (st.get("plan") or {}).get("replicas") or []]


def _settled(kube: client.ApiClient, procs: list[local_agents.AgentProcess], n: int) -> bool:
    """`n` replicas planned, asked for, and loaded on the agents (nothing else left)."""
    st = _status(kube)
    want = (st.get("autoscaling") or {}).get("desiredReplicas")
    held = {b[0] for p in procs for b in blocks(p)}
    return want == n and len(_planned(kube)) == n and held == set(_planned(kube))


def test_load_adds_a_peer_sourced_replica_and_calm_removes_it(
    plain_agents: list[local_agents.AgentProcess],
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
    gateway_process: Callable[..., str],
    tmp_path: Path,
) -> None:
    procs = plain_agents
    tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
    want = tok.decode(hf_greedy(tiny_llama, PROMPT, NEW), skip_special_tokens=True)
    routes = tmp_path / "routes.json"
    routes.write_text('{"replicas": []}')
    url = gateway_process(routes, tiny_llama)
    doc = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ServingDeployment",
        "metadata": {"name": "grow", "namespace": "default"},
        "spec": {
            "model": {"name": "tiny-llama", "path": str(tiny_llama)},
            "layout": {"mode": "auto", "kvCacheBytes": 16 << 20},
            "gateway": {"port": 8000},
            "slo": {"ttftP99Ms": 1},
            "scaling": {
                "enabled": True,
                "replicas": {"min": 1, "max": 2},
                "signals": {"scaleDownAfterSeconds": 2, "upCooldownSeconds": 1},
            },
        },
    }
    # no resync in the test's time: a new count is planned by the tick's own pass
    start_operator(
        refs(procs), gateway_admin_url=url, autoscale_tick_seconds=0.3, resync_seconds=3600
    )
    create(kube, doc)
    wait_for("two planned replicas", lambda: len(_planned(kube)) == 2, timeout=180)
    mirror = Mirror(kube, "grow", routes)
    wait_for("routes ConfigMap", mirror.sync)
    mirror.start()
    try:
        # calm, no host cache: the plan shrinks to one replica (min 1)
        wait_for("the plan shrunk to 1", lambda: _settled(kube, procs, 1), timeout=90, every=0.3)
        assert any(r == "ReplicasResized" for r, _ in events(kube, "grow"))
        kept = _planned(kube)[0]
        wait_for("the gateway serving", lambda: _serving(url), timeout=60, every=0.5)

        # load: TTFT over the SLO -> the plan grows back to 2, the new one peer-sourced
        got: list[tuple[int, str]] = []
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                got.extend(asyncio.run(_burst(url, 4)))

        t = threading.Thread(target=load, daemon=True)
        t.start()
        try:
            wait_for(
                "the plan grown to 2", lambda: _settled(kube, procs, 2), timeout=120, every=0.3
            )
            added = next(r for r in _planned(kube) if r != kept)

            def sourced() -> dict[str, Any] | None:
                rs = _status(kube).get("replicaSources") or []
                return next((e for e in rs if e.get("replicaId") == added), None)

            entry = wait_for("the new replica's sources", sourced, timeout=60, every=0.3)
            wait_for("the new replica serving", lambda: any(r == added for r in _routed(routes)))
        finally:
            stop.set()
            t.join(120)
        assert entry["source"].get("peer", 0) > 0, entry  # assembled from the peer
        assert entry["source"].get("storage", 0) == 0, entry
        assert got and got == [(200, want)] * len(got), got[:3]
        resized = [m for r, m in events(kube, "grow") if r == "ReplicasResized"]
        assert any("plan 1 -> 2" in m for m in resized), resized

        # calm again: removed, and the one left still serves
        wait_for("the plan shrunk again", lambda: _settled(kube, procs, 1), timeout=90, every=0.3)
        assert asyncio.run(_burst(url, 2)) == [(200, want)] * 2
    finally:
        mirror.stop()


def _routed(routes: Path) -> list[str]:
    doc = json.loads(routes.read_text() or "{}")
    return [str(r.get("id") or "") for r in doc.get("replicas", [])]
