"""The operator's reconcile pass and its loops' ticks share one observation per deployment.

Fake in-process agents count the `Describe` calls they answer. A reconcile pass
(`reconciler.run`, its converge replaced by one that takes the pass's observation) and an
overload, an autoscale and a module-scaling tick of the same tick interval ask each agent
for `Describe` once (each observed on its own before: four rounds); a tick after a loop
acted, or once the interval has passed, observes again; and the loops act over the pass's
kept channels (`agents.Channels`), not channels of their own.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import kopf
import pytest

from tessera.control import (
    agents,
    autoscale_loop,
    converge,
    gateway_demand,
    gateway_itl,
    gateway_load,
    observation,
    outcome,
)
from tessera.policies.scaling import signal as sig
from tessera.policies.security import admission
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_operator import (
    autoscale_tick,
    config,
    discovery,
    overload_loop,
    reconciler,
    scaling_tick,
)


class CountingAgent(pb_grpc.AgentServicer):  # type: ignore[misc]
    """An agent with one empty CPU device that counts the `Describe` calls it answers."""

    def __init__(self) -> None:
        self.describes = 0

    async def Describe(self, request: Any, context: Any) -> pb.DescribeReply:
        self.describes += 1
        return pb.DescribeReply(
            devices=[pb.Device(id="cpu:0", kind="cpu", capacity_bytes=2 << 30, free_bytes=2 << 30)]
        )


def _body(model: Path) -> kopf.Body:
    def replica(rid: str, agent: str) -> dict[str, Any]:
        return {"replicaId": rid, "stages": [{"agent": agent, "layers": [0, 8], "tp": 1}]}

    def spec_replica(name: str, agent: str) -> dict[str, Any]:
        return {"name": name, "stages": [{"agent": agent, "device": "cpu:0", "layers": [0, 8]}]}

    return kopf.Body(
        {
            "apiVersion": "serving.tessera.dev/v1alpha1",
            "kind": "ServingDeployment",
            "metadata": {"name": "tiny", "namespace": "default", "generation": 1, "uid": "u"},
            "spec": {
                "model": {"name": "tiny-llama", "path": str(model), "dtype": "float32"},
                "layout": {
                    "mode": "explicit",
                    "kvCacheBytes": 16 << 20,
                    "replicas": [spec_replica("r0", "a0"), spec_replica("r1", "a1")],
                },
                "slo": {"ttftP99Ms": 2000, "tpotP99Ms": 200},
                "policies": {"overload": {"enabled": True}, "scaling": {"enabled": True}},
                "scaling": {"enabled": True, "replicas": {"min": 0}},
                "gateway": {"port": 8000, "replicas": 1},
            },
            "status": {"plan": {"replicas": [replica("d-r0", "a0"), replica("d-r1", "a1")]}},
        }
    )


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """Everything but the agents and the observation faked: the gateway's signals, the
    converge pass (it takes the pass's observation, as `converge.converge` does), the
    admission and the routes ConfigMap read."""
    seen: list[observation.Observation | None] = []

    async def fake_converge(*args: Any, shared: Any = None, **kw: Any) -> outcome.Outcome:
        seen.append(shared)
        obs = await shared.get()
        return outcome.Outcome("Serving", "", observed=obs)

    async def no_cm(ctx: Any, dep: Any) -> None:
        return None

    async def calls(url: str, token: str = "", session: object = None) -> gateway_load.Calls:
        return {}

    async def demand(url: str, token: str = "", session: object = None) -> gateway_demand.Demand:
        return gateway_demand.Demand()

    async def itl(url: str, token: str = "", session: object = None) -> sig.Hist:
        return sig.Hist((float("inf"),), (0.0,), 0.0, 0.0)

    posted: list[str] = []
    for post in ("info", "warn", "event", "exception"):
        monkeypatch.setattr(kopf, post, lambda body, reason="", **kw: posted.append(reason))
    monkeypatch.setattr(converge, "converge", fake_converge)
    monkeypatch.setattr(reconciler, "_routes_config_map", no_cm)
    monkeypatch.setattr(admission, "admit", lambda *a, **k: admission.Verdict(True, "", ""))
    monkeypatch.setattr(gateway_load, "fetch", calls)
    monkeypatch.setattr(gateway_demand, "fetch", demand)
    monkeypatch.setattr(gateway_itl, "fetch", itl)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    return {"seen": seen, "model": tmp_path, "posted": posted}


async def _agents(n: int) -> list[tuple[grpc.aio.Server, CountingAgent, str]]:
    out = []
    for _ in range(n):
        srv = transport.server()
        agent = CountingAgent()
        pb_grpc.add_AgentServicer_to_server(agent, srv)
        port = transport.add_port(srv, "127.0.0.1:0", tls=None)
        await srv.start()
        out.append((srv, agent, f"127.0.0.1:{port}"))
    return out


def test_a_pass_and_the_ticks_of_one_interval_describe_each_agent_once(
    fakes: dict[str, Any],
) -> None:
    body = _body(fakes["model"])

    async def go() -> None:
        started = await _agents(2)
        refs = tuple(agents.AgentRef(f"a{i}", addr) for i, (_, _, addr) in enumerate(started))
        cfg = config.OperatorConfig(agents=refs, gateway_admin_url="http://127.0.0.1:1")
        assert await discovery.agent_refs(cfg, None, {}) == list(refs)  # type: ignore[arg-type]
        clock = Clock()
        memo = kopf.Memo()
        memo["ctx"] = reconciler.Context(cfg, None)  # type: ignore[arg-type]
        channels = agents.Channels(tls=None)
        memo["pass"] = observation.Pass(
            observation.Observation([], channels=channels, max_age_s=0.5, clock=clock, tls=None)
        )
        patch = kopf.Patch()

        def describes() -> list[int]:
            return [a.describes for _, a, _ in started]

        try:
            await reconciler.run(body, patch, memo)
            assert fakes["seen"] and fakes["seen"][0] is memo["pass"].observation
            await overload_loop.tick(body, patch, memo, cfg)
            await autoscale_tick.tick(body, patch, memo, cfg)
            await scaling_tick.tick(body, patch, memo, cfg)
            assert describes() == [1, 1]  # one observation for the pass and three ticks
            # the loops act over the pass's kept channels
            loop = memo[overload_loop.LOOP_KEY]
            assert loop.driver.channels is channels
            assert memo[autoscale_tick.LOOP_KEY].leaders.channels is channels
            assert memo[scaling_tick.LOOP_KEY].channels is channels

            clock.t += 1.0  # the interval passed: the next tick observes afresh
            await overload_loop.tick(body, patch, memo, cfg)
            await autoscale_tick.tick(body, patch, memo, cfg)
            assert describes() == [2, 2]

            # a loop that acted drops the observation: the next tick observes again
            async def slept(*a: Any, **k: Any) -> autoscale_loop.Tick:
                return autoscale_loop.Tick(slept=["d-r0"])

            memo[autoscale_tick.LOOP_KEY].tick = slept
            await autoscale_tick.tick(body, patch, memo, cfg)
            assert describes() == [2, 2]  # it acted on the observation it was given
            await overload_loop.tick(body, patch, memo, cfg)
            assert describes() == [3, 3]
            await scaling_tick.tick(body, patch, memo, cfg)
            assert describes() == [3, 3]
        finally:
            await channels.close()
            for srv, _, _ in started:
                await srv.stop(grace=None)

    asyncio.run(go())


def test_an_agent_that_does_not_answer_is_down_for_the_autoscaler() -> None:
    """Given the pass's replies, a leader absent from them did not answer."""

    async def go() -> None:
        loop = autoscale_loop.AutoscaleLoop(autoscale_loop.Leaders(tls=None))
        kv = pb.ReplicaKV(replica_id="r0", pages_total=4, pages_used=1)
        signals, down = await loop.observe(
            {"r0": "x:1", "r1": "y:1"},
            gateway_demand.Demand(),
            described={"x:1": pb.DescribeReply(kv=[kv])},
        )
        assert down == ["y:1"] and [r.replica_id for r in signals.replicas] == ["r0"]
        await loop.close()

    asyncio.run(go())
