"""The predictive switching loop through the operator: KMock API server, real agents, a
fake gateway serving `/admin/v1/arrivals`. Advisory mode reports the recommendation in
`status.switching` and an event and changes nothing; active mode switches the layout
through the transition path (make-before-break), greedy tokens still `transformers'`.
Without injected candidates the operator's default source (the planner on the observed
agents) recommends a planner layout."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera import api, model_facts
from tessera.cli import local_agents
from tessera.cost import analytic
from tessera.policies.switching import candidates as switching_candidates
from tessera_operator import switching_loop
from tests.conftest import hf_greedy
from tests.operator.conftest import create, events, get_sd, wait_for
from tests.operator.test_operator_lifecycle import blocks, manifest, ready, refs
from tests.operator.test_operator_transitions import _pipe, _routes, _tokens, _whole

pytestmark = pytest.mark.slow
Start = Callable[..., list[local_agents.AgentProcess]]
TWO_WHOLE = [_whole("r0", "agent-0"), _whole("r1", "agent-1")]
WITH_PIPE = [_whole("r0", "agent-0"), _pipe("r1", 4)]
CLASSES = ["short", "long"]


def _price(name: str, demand: tuple[float, ...]) -> float:
    """ "two-whole" suits short requests, "whole+pipe" long ones (a made-up model)."""
    short, long = demand
    other = long if name == "two-whole" else short
    return 1.0 + 4.0 * other / (short + long)


def candidates(dep: api.ServingDeployment, names: list[str]) -> switching_loop.SwitchingCandidates:
    assert names == CLASSES
    return switching_loop.SwitchingCandidates(
        {"two-whole": TWO_WHOLE, "whole+pipe": WITH_PIPE}, _price, lambda a, b: 0.1
    )


class FakeGateway:
    """Serves a fixed arrivals document (long requests dominate) on 127.0.0.1."""

    def __init__(self) -> None:
        doc = {"spanSeconds": 1.0, "classes": CLASSES, "spans": [[1, 20]] * 4, "current": [0, 0]}
        self.hits = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.hits += 1
                body = json.dumps(doc).encode()
                self.send_response(200 if self.path.endswith("/arrivals") else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    gw = FakeGateway()
    yield gw
    gw.close()


def _create(kube: client.ApiClient, name: str, tiny: Path, mode: str, auto: bool = False) -> None:
    doc = manifest(name, tiny, TWO_WHOLE)
    if auto:  # the auto pass places two whole replicas (the simple plan): TWO_WHOLE again
        doc["spec"]["layout"] = {"mode": "auto", "kvCacheBytes": 16 << 20}
    doc["spec"]["policies"] = {
        "switching": {"enabled": True, "mode": mode, "spanSeconds": 1, "minGain": 0.1}
    }
    create(kube, doc)


def _shape(replicas: list[dict[str, Any]]) -> list[tuple[str, list[tuple[str, list[int]]]]]:
    """A layout without the defaults the API server fills in (tp)."""
    return [(r["name"], [(st["agent"], st["layers"]) for st in r["stages"]]) for r in replicas]


def _switching(kube: client.ApiClient, name: str) -> dict[str, Any]:
    return dict(((get_sd(kube, name) or {}).get("status") or {}).get("switching") or {})


def _start(
    start_operator: Callable[..., Any], procs: list[local_agents.AgentProcess], gw: FakeGateway
) -> None:
    start_operator(
        refs(procs),
        switching_tick_seconds=0.2,
        switching_arrivals_url=gw.url + "/{namespace}/{name}/arrivals",
        switching_candidates=candidates,
    )


def test_advisory_mode_reports_and_changes_nothing(
    agents_factory: Start,
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
    gateway: FakeGateway,
) -> None:
    procs = agents_factory(2)
    _start(start_operator, procs, gateway)
    _create(kube, "adv", tiny_llama, "advisory")
    wait_for("generation 1 Current", lambda: ready(kube, "adv"), timeout=180)
    before = {p.agent_id: blocks(p) for p in procs}
    sw = wait_for(
        "a recommendation",
        lambda: (s := _switching(kube, "adv")).get("reason") == "Recommend" and s,
        timeout=60,
    )
    assert sw["mode"] == "advisory" and sw["current"] == "two-whole"
    assert sw["recommended"] == {"name": "whole+pipe", "replicas": WITH_PIPE}
    last = sw["lastDecision"]
    assert last["action"] == "recommend" and last["candidate"] == "whole+pipe"
    assert last["expectedGain"] > last["switchCost"] > 0
    assert "advisory: nothing changed" in last["reason"]
    assert sw["forecast"]["method"] == "last_value" and sw["forecast"]["counts"] == [1, 20]
    assert sw["latencies"]["whole+pipe"] < sw["latencies"]["two-whole"]
    time.sleep(2.0)  # two more spans: still nothing changes
    obj = get_sd(kube, "adv")
    assert obj is not None and obj["metadata"]["generation"] == 1
    assert _shape(obj["spec"]["layout"]["replicas"]) == _shape(TWO_WHOLE)
    assert _routes(kube, "adv")["version"] == 1
    assert {p.agent_id: blocks(p) for p in procs} == before
    assert "SwitchRecommended" in [r for r, _ in events(kube, "adv")]
    assert "SwitchApplied" not in [r for r, _ in events(kube, "adv")]


def test_active_mode_switches_through_a_transition(
    agents_factory: Start,
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
    gateway: FakeGateway,
) -> None:
    """Started as `layout: auto`: the auto placement is priced as "two-whole" (the same
    blocks), and the switch writes an explicit layout (the loop now owns spec.layout)."""
    procs = agents_factory(2)
    _start(start_operator, procs, gateway)
    _create(kube, "act", tiny_llama, "active", auto=True)
    obj = wait_for("generation 2 Current", lambda: ready(kube, "act", 2), timeout=240)
    assert obj["spec"]["layout"]["mode"] == "explicit"
    assert _shape(obj["spec"]["layout"]["replicas"]) == _shape(WITH_PIPE)
    sw = obj["status"]["switching"]
    assert sw["lastSwitch"]["from"] == "two-whole" and sw["lastSwitch"]["to"] == "whole+pipe"
    assert sw["lastSwitch"]["layoutWas"] == "auto"
    applied = [m for r, m in events(kube, "act") if r == "SwitchApplied"]
    assert applied and "now owns spec.layout" in applied[0]
    doc = _routes(kube, "act")
    assert [r["id"] for r in doc["replicas"]] == ["default.act.r0.g1", "default.act.r1.g2"]
    held = {p.agent_id: blocks(p) for p in procs}
    assert held == {
        "agent-0": [("default.act.r0.g1", 0, 0, 8), ("default.act.r1.g2", 0, 0, 4)],
        "agent-1": [("default.act.r1.g2", 1, 4, 8)],
    }
    prompt = [1, 5, 9, 13]
    assert _tokens(procs[0], "default.act.r1.g2") == hf_greedy(tiny_llama, prompt, 6)
    assert [r for r, _ in events(kube, "act")].count("SwitchApplied") == 1
    # the new layout is the best: later spans stay (no flapping)
    wait_for(
        "a step on the new layout",
        lambda: _switching(kube, "act").get("current") == "whole+pipe",
        timeout=30,
    )
    time.sleep(1.5)
    after = get_sd(kube, "act")
    assert after is not None and after["metadata"]["generation"] == 2
    assert _switching(kube, "act")["reason"] == "Stay"
    assert _switching(kube, "act")["specLayout"] == "explicit"
    assert gateway.hits >= 3


PIPE_ONE_AGENT = [
    {
        "name": "r0",
        "stages": [
            {"agent": "agent-0", "device": "cpu:0", "layers": [0, 4]},
            {"agent": "agent-0", "device": "cpu:1", "layers": [4, 8]},
        ],
    }
]
TWO_WHOLE_ONE_AGENT = [
    {"name": "r0", "stages": [{"agent": "agent-0", "device": "cpu:0", "layers": [0, 8]}]},
    {"name": "r1", "stages": [{"agent": "agent-0", "device": "cpu:1", "layers": [0, 8]}]},
]


def test_advisory_recommends_a_planner_layout_by_default(
    agents_factory: Start,
    tiny_llama: Path,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
    gateway: FakeGateway,
) -> None:
    """No `switching_candidates`: the planner prices its layouts on the one agent's two
    devices with a stand-in CPU profile (the H100 analytic coefficients relabelled, model
    output); the spec's one two-stage replica is a candidate too, and two whole replicas
    are modelled ~7 % faster at the gateway's 1 short + 20 long req/s (minGain 0.05)."""
    procs = agents_factory(1, devices="cpu:2x512MiB")
    shape = model_facts.served_shape(str(tiny_llama), "float32")
    assert shape is not None
    stand_in = analytic.analytic_profile(shape, "h100-80gb")
    profile = dataclasses.replace(stand_in, device="cpu", source="measured")
    start_operator(
        refs(procs),
        switching_tick_seconds=0.2,
        switching_arrivals_url=gateway.url + "/{namespace}/{name}/arrivals",
        switching_profile=profile,
    )
    doc = manifest("auto-cands", tiny_llama, PIPE_ONE_AGENT)
    doc["spec"]["workload"] = {
        "classes": [
            {"name": "short", "inputTokens": 32, "outputTokens": 8},
            {"name": "long", "inputTokens": 512, "outputTokens": 64},
        ]
    }
    doc["spec"]["policies"] = {
        "switching": {"enabled": True, "mode": "advisory", "spanSeconds": 1, "minGain": 0.05}
    }
    create(kube, doc)
    sw = wait_for(
        "a recommendation",
        lambda: (s := _switching(kube, "auto-cands")).get("reason") == "Recommend" and s,
        timeout=120,
    )
    planner_name = "1x[tp1pp1 tp1pp1]"
    assert sw["current"] == switching_candidates.SPEC
    assert set(sw["latencies"]) == {switching_candidates.SPEC, planner_name}
    assert sw["latencies"][planner_name] < sw["latencies"][switching_candidates.SPEC]
    assert sw["recommended"] == {"name": planner_name, "replicas": TWO_WHOLE_ONE_AGENT}
    obj = get_sd(kube, "auto-cands")
    assert obj is not None and obj["metadata"]["generation"] == 1
    assert _shape(obj["spec"]["layout"]["replicas"]) == _shape(PIPE_ONE_AGENT)
    assert "SwitchRecommended" in [r for r, _ in events(kube, "auto-cands")]

    # the same on a `layout: auto` spec (same agent, no new processes): its current
    # deployment is what the auto pass placed (status.plan; here the simple plan's two whole
    # replicas), priced as "auto"; the planner's identical layout is reported as current
    doc = manifest("auto-spec", tiny_llama, PIPE_ONE_AGENT)
    doc["spec"]["layout"] = {"mode": "auto", "kvCacheBytes": 16 << 20}
    doc["spec"]["workload"] = {
        "classes": [
            {"name": "short", "inputTokens": 32, "outputTokens": 8},
            {"name": "long", "inputTokens": 512, "outputTokens": 64},
        ]
    }
    doc["spec"]["policies"] = {
        "switching": {"enabled": True, "mode": "active", "spanSeconds": 1, "minGain": 0.05}
    }
    create(kube, doc)
    sw = wait_for(
        "a step on the auto placement",
        lambda: (s := _switching(kube, "auto-spec")).get("reason") == "Stay" and s,
        timeout=120,
    )
    obj = get_sd(kube, "auto-spec")
    assert obj is not None and obj["status"]["plan"]["source"].startswith("auto")
    assert sw["specLayout"] == "auto" and sw["current"] == planner_name
    assert set(sw["latencies"]) == {switching_candidates.AUTO, planner_name}
    assert sw["latencies"][switching_candidates.AUTO] == sw["latencies"][planner_name]
    assert obj["metadata"]["generation"] == 1 and obj["spec"]["layout"]["mode"] == "auto"
