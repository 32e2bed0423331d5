"""The operator runs the module-scaling loop (issue 30): KMock, two agents, a gateway process.

One whole replica on agent-0, agent-1 idle, `spec.policies.scaling.enabled` with a TPOT
target. The operator reads the gateway's inter-token histogram (`GET /metrics` of the
gateway process, whose routes come from the ConfigMap) and ticks the loop: with an idle
device beside a serving replica it replicates a layer run there (`LayerRunReplicated`,
`status.scaling.layerRuns`); an operator restarted then adopts it (the runs stay as they
were), and turning the policy off evicts it (`LayerRunEvicted`), found from what the
agents report. Every completion returns transformers' greedy text.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tokenizers import Tokenizer

from tessera.cli import local_agents
from tests.conftest import hf_greedy
from tests.operator.conftest import GROUP, PLURAL, VERSION, custom, events, get_sd, wait_for
from tests.operator.test_operator_lifecycle import manifest, ready, refs
from tests.operator.test_operator_overload_loop import (
    NEW,
    PROMPTS,
    Mirror,
    _burst,
    _serving,
    gateway_process,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.slow
Start = Callable[..., list[local_agents.AgentProcess]]
ONE = [{"name": "r0", "stages": [{"agent": "agent-0", "device": "cpu:0", "layers": [0, 8]}]}]


def _runs(kube: client.ApiClient) -> list[Any]:
    return list(
        ((get_sd(kube, "sc") or {}).get("status") or {}).get("scaling", {}).get("layerRuns") or []
    )


def test_operator_replicates_onto_an_idle_device_and_evicts(
    agents_factory: Start,
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
    gateway_process: Callable[..., str],  # noqa: F811
    tmp_path: Path,
) -> None:
    import asyncio

    tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
    want = [tok.decode(hf_greedy(tiny_llama, p, NEW), skip_special_tokens=True) for p in PROMPTS]
    procs = agents_factory(2)
    routes = tmp_path / "routes.json"
    routes.write_text('{"replicas": []}')
    url = gateway_process(routes, tiny_llama)
    doc = manifest("sc", tiny_llama, ONE)
    doc["spec"]["policies"] = {"scaling": {"enabled": True}}
    doc["spec"]["slo"] = {"tpotP99Ms": 1000}
    first = start_operator(refs(procs), gateway_admin_url=url, scaling_tick_seconds=1.0)
    custom(kube).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, doc)
    wait_for("Ready=True", lambda: ready(kube, "sc"), timeout=180)
    mirror = Mirror(kube, "sc", routes)
    wait_for("routes ConfigMap", mirror.sync)
    mirror.start()
    stop = threading.Event()
    texts: list[str] = []

    def serve() -> None:  # a steady stream of requests on r0
        while not stop.is_set():
            texts.extend(asyncio.run(_burst(url, 3)))

    try:
        wait_for("the gateway serving", lambda: _serving(url), timeout=60, every=0.5)
        t = threading.Thread(target=serve, daemon=True)
        t.start()
        try:
            wait_for("a replicated layer run", lambda: _runs(kube), timeout=120)
        except AssertionError:
            raise AssertionError(f"no run; events {events(kube, 'sc')}") from None
        assert "LayerRunReplicated" in dict(events(kube, "sc"))
        placed = _runs(kube)
        # a new operator, nothing in memory: it adopts the runs the agents report
        first.stop(timeout=60)
        start_operator(refs(procs), gateway_admin_url=url, scaling_tick_seconds=1.0)
        time.sleep(4.0)  # a few ticks of the new loop
        assert _runs(kube) == placed  # neither placed again nor lost
        custom(kube).patch_namespaced_custom_object(
            GROUP,
            VERSION,
            "default",
            PLURAL,
            "sc",
            {"spec": {"policies": {"scaling": {"enabled": False}}}},
        )
        wait_for("the run evicted", lambda: not _runs(kube), timeout=120)
        assert "LayerRunEvicted" in dict(events(kube, "sc"))
        stop.set()
        t.join(300)
        assert texts and all(x in want for x in texts)
    finally:
        stop.set()
        mirror.stop()
