"""The operator runs the module-scaling loop (issue 30): KMock, two agents, a gateway process.

One whole replica on agent-0, agent-1 idle, `spec.policies.scaling.enabled` with a TPOT
target of 1 ms that every inter-token gap misses (a sustained violation). The operator
reads the gateway's inter-token histogram (`GET /metrics` of the gateway process, whose
routes come from the ConfigMap) and ticks the loop:

- under the violation, with an idle device beside the serving replica, it replicates a
  layer run there (`LayerRunReplicated`, `status.scaling.layerRuns`); an operator
  restarted then adopts it (the runs stay as they were); once the requests stop, no
  window violates and after `evictAfterSeconds` the loop evicts the run (`LayerRunEvicted`)
  with the policy still on, and replicates nothing again while the calm lasts;
- the operator process is killed (SIGKILL) while the replication is in flight (agent-1
  loads layer runs slowly: `--run-load-delay`): the agent finishes it, a new operator
  sees it in flight (`Describe.scaling_pending`) and repeats nothing, and the run ends
  present once, serving requests; turning the policy off then evicts it, found from what
  the agents report.

Every completion returns transformers' greedy text; none is lost. The gateway has API
keys on and the operator's admin token (`gateway_process`): the operator's pulls carry it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client
from tokenizers import Tokenizer

from tessera.cli import local_agents
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_operator.testing import background
from tests.conftest import hf_greedy
from tests.operator.conftest import GROUP, PLURAL, VERSION, create, custom, events, get_sd, wait_for
from tests.operator.test_operator_lifecycle import manifest, ready, refs
from tests.operator.test_operator_overload_loop import (
    ADMIN_TOKEN,
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
    url = gateway_process(routes, tiny_llama, keys=True)
    with pytest.raises(urllib.error.HTTPError, match="401"):  # keys on: admin is closed
        urllib.request.urlopen(url + "/admin/v1/load", timeout=10)
    doc = manifest("sc", tiny_llama, ONE)
    doc["spec"]["policies"] = {"scaling": {"enabled": True, "evictAfterSeconds": 3}}
    doc["spec"]["slo"] = {"tpotP99Ms": 1}
    first = start_operator(
        refs(procs),
        gateway_admin_url=url,
        gateway_admin_token=ADMIN_TOKEN,
        scaling_tick_seconds=1.0,
    )
    create(kube, doc)
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
        start_operator(
            refs(procs),
            gateway_admin_url=url,
            gateway_admin_token=ADMIN_TOKEN,
            scaling_tick_seconds=1.0,
        )
        time.sleep(4.0)  # a few ticks of the new loop
        assert _runs(kube) == placed  # neither placed again nor lost
        stop.set()  # no more requests: no window violates from now on
        t.join(300)
        wait_for("the run evicted", lambda: not _runs(kube), timeout=120)
        said = [m for r, m in events(kube, "sc") if r == "ModuleScaling"]
        assert any("evictAfterSeconds 3" in m for m in said), said
        assert "LayerRunEvicted" in dict(events(kube, "sc"))
        assert get_sd(kube, "sc")["spec"]["policies"]["scaling"]["enabled"]  # still on
        time.sleep(4.0)  # the calm goes on: nothing is replicated again
        assert not _runs(kube)
        said_all = events(kube, "sc")
        assert [r for r, _ in said_all].count("LayerRunReplicated") == 1, said_all
        assert texts and all(x in want for x in texts)
    finally:
        stop.set()
        mirror.stop()


_STUBS: dict[str, pb_grpc.AgentStub] = {}


def _describe(a: local_agents.AgentProcess) -> pb.DescribeReply:
    """The agent's `Describe`, over one channel per agent for the test (polled often)."""
    if a.address not in _STUBS:
        _STUBS[a.address] = pb_grpc.AgentStub(transport.sync_channel(a.address, tls=None))
    for attempt in range(3):  # a loaded machine may drop a connection now and then
        try:
            reply: pb.DescribeReply = _STUBS[a.address].Describe(pb.DescribeRequest(), timeout=10.0)
            return reply
        except grpc.RpcError:
            if attempt == 2:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def _operator_process(
    api: str, procs: list[local_agents.AgentProcess], gateway: str, log: Path
) -> subprocess.Popen[str]:
    """`tessera operator` as its own process (so it can be killed), against the test API."""
    cmd = [sys.executable, "-m", "tessera.cli.main", "operator", "--api-server", api]
    for a in procs:
        cmd += ["--agent", f"{a.agent_id}={a.address}"]
    cmd += ["--gateway-admin-url", gateway, "--scaling-tick", "1", "--resync", "1"]
    cmd += ["--allow-host-path", "--allowed-model-root", "/", "-n", "default", "--quiet"]
    (log.parent / "operator-token").write_text(ADMIN_TOKEN)
    cmd += ["--gateway-admin-token-file", str(log.parent / "operator-token")]
    with log.open("w") as out:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)


def test_operator_killed_mid_replication_converges_from_the_agents(
    tiny_llama: Path,
    api_server: background.ApiServerThread,
    start_operator: Callable[..., Any],
    kube: client.ApiClient,
    gateway_process: Callable[..., str],  # noqa: F811
    tmp_path: Path,
) -> None:
    import asyncio

    tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
    want = [tok.decode(hf_greedy(tiny_llama, p, NEW), skip_special_tokens=True) for p in PROMPTS]
    procs = [
        local_agents.start_agent("agent-0", "cpu:1x512MiB", 1),
        local_agents.start_agent(
            "agent-1", "cpu:1x512MiB", 1, extra_args=["--run-load-delay", "8"]
        ),
    ]
    routes = tmp_path / "routes.json"
    routes.write_text('{"replicas": []}')
    url = gateway_process(routes, tiny_llama, keys=True)
    doc = manifest("sc", tiny_llama, ONE)
    doc["spec"]["policies"] = {"scaling": {"enabled": True, "evictAfterSeconds": 600}}
    doc["spec"]["slo"] = {"tpotP99Ms": 1}
    first = _operator_process(api_server.url, procs, url, tmp_path / "operator.log")
    mirror = Mirror(kube, "sc", routes)
    stop = threading.Event()
    texts: list[str] = []

    def serve() -> None:  # a steady stream of requests on r0
        while not stop.is_set():
            texts.extend(asyncio.run(_burst(url, 3)))

    try:
        create(kube, doc)
        wait_for("Ready=True", lambda: ready(kube, "sc"), timeout=180)
        wait_for("routes ConfigMap", mirror.sync)
        mirror.start()
        wait_for("the gateway serving", lambda: _serving(url), timeout=60, every=0.5)
        t = threading.Thread(target=serve, daemon=True)
        t.start()
        wait_for("a replication in flight", lambda: _describe(procs[0]).scaling_pending, 120)
        first.kill()  # SIGKILL: its call to the agent is cut in the middle
        first.wait(30)
        inflight = _describe(procs[0]).scaling_pending
        assert inflight and not _describe(procs[0]).scaling_runs  # the agent carries on
        start_operator(
            refs(procs),
            gateway_admin_url=url,
            gateway_admin_token=ADMIN_TOKEN,
            scaling_tick_seconds=1.0,
        )
        wait_for("the run reported", lambda: _runs(kube), timeout=120)
        assert not _describe(procs[0]).scaling_pending
        runs = _describe(procs[0]).scaling_runs
        assert len(runs) == 1 and len(_describe(procs[1]).scaling_hosted) == 1  # no duplicate
        (run,) = runs
        assert (run.layer_start, run.layer_end) == (inflight[0].layer_start, inflight[0].layer_end)

        # the target met from now on: the loop lifts the batch cut Algorithm 2 made under
        # the violation (a batch of one stays on the home), the run stays placed
        custom(kube).patch_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, "sc", {"spec": {"slo": {"tpotP99Ms": 1000}}}
        )

        def routed() -> bool:  # the replica takes requests
            (r,) = _describe(procs[0]).scaling_runs
            return any(h.placed > 0 for h in r.holders if not h.home)

        wait_for("requests on the replica", routed, timeout=60, every=0.5)
        time.sleep(3.0)  # a few more ticks of the new operator: still one run, one copy
        assert len(_describe(procs[0]).scaling_runs) == 1
        assert len(_describe(procs[1]).scaling_hosted) == 1
        said = [m for r, m in events(kube, "sc") if r == "ModuleScaling"]
        assert not any(" op replicate " in m for m in said), said  # nobody asked twice
        stop.set()
        t.join(300)
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
        assert not _describe(procs[1]).scaling_hosted
        assert texts and all(x in want for x in texts)
    finally:
        stop.set()
        mirror.stop()
        if first.poll() is None:
            first.kill()
        for a in procs:
            local_agents.stop_agent(a)
