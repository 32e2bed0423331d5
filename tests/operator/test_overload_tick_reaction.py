"""An overload tick that acted does not blind the loop (issue 30).

The tick after a drop used to run a whole reconcile pass under the deployment's lock
(three API reads and a new observation) and return its status patch to kopf, which
applied it before the timer slept again: the next tick waited 0.6-1.6 s under load. Now
the tick observes once more, writes `status.overload` and the `Overloaded` condition
from a task of its own and returns. Faked: the gateway's load, discovery, the agents'
observation (a dropped group `d-r0` on two agents), the loop (it acts on every tick),
the API server (a status write that blocks until released), kopf's events.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest

from tessera import blocks, observed
from tessera.control import agents, gateway_load, observation, overload_driver
from tessera.control import overload as control
from tessera_operator import config, discovery, overload_loop, reconciler


def _body(status: dict[str, Any] | None = None) -> kopf.Body:
    def replica(rid: str, agent: str) -> dict[str, Any]:
        return {"replicaId": rid, "stages": [{"agent": agent, "layers": [0, 8], "tp": 1}]}

    def spec_replica(name: str, agent: str) -> dict[str, Any]:
        return {"name": name, "stages": [{"agent": agent, "device": "cpu:0", "layers": [0, 8]}]}

    return kopf.Body(
        {
            "apiVersion": "serving.tessera.dev/v1alpha1",
            "kind": "ServingDeployment",
            "metadata": {"name": "tiny", "namespace": "default", "generation": 3, "uid": "u"},
            "spec": {
                "model": {"name": "tiny-llama", "path": "/m", "dtype": "float32"},
                "layout": {
                    "mode": "explicit",
                    "kvCacheBytes": 16 << 20,
                    "replicas": [spec_replica("r0", "a0"), spec_replica("r1", "a1")],
                },
                "slo": {"ttftP99Ms": 2000, "tpotP99Ms": 200},
                "policies": {"overload": {"enabled": True}},
                "gateway": {"port": 8000, "replicas": 1},
            },
            "status": {
                "plan": {"replicas": [replica("d-r0", "a0"), replica("d-r1", "a1")]},
                **(status or {}),
            },
        }
    )


def _dropped() -> observed.Observed:
    def stage(i: int, start: int, end: int) -> blocks.Block:
        return blocks.Block(
            "/m", start, end, replica_id="d-r0", stage_index=i, num_stages=2, kv_pages=20
        )

    return observed.Observed(
        (
            observed.AgentInfo("a0", "127.0.0.1:1", blocks=(stage(0, 0, 4),)),
            observed.AgentInfo("a1", "127.0.0.1:2", blocks=(stage(1, 4, 8),)),
        )
    )


class ActingLoop(control.OverloadLoop):
    async def tick(self, *args: Any, **kw: Any) -> control.Tick:
        self.runs += 1
        return control.Tick(acted=True, drops=1)


class SlowKube:
    """The API server: a status write blocks until `release` (a loaded API server)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, dict[str, Any]]] = []
        self.release = asyncio.Event()

    async def merge_patch(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        await self.release.wait()
        self.writes.append((url, body))
        return body


@pytest.fixture
def posted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    out: list[str] = []
    for post in ("info", "warn"):
        monkeypatch.setattr(kopf, post, lambda body, reason="", **kw: out.append(reason))

    async def calls(url: str, token: str = "", session: object = None) -> gateway_load.Calls:
        return {}

    async def refs(*a: Any, **k: Any) -> list[agents.AgentRef]:
        return [agents.AgentRef("a0", "127.0.0.1:1"), agents.AgentRef("a1", "127.0.0.1:2")]

    async def no_pass(*a: Any, **k: Any) -> None:
        raise AssertionError("an acting tick ran a reconcile pass")

    monkeypatch.setattr(gateway_load, "fetch", calls)
    monkeypatch.setattr(discovery, "agent_refs", refs)
    monkeypatch.setattr(reconciler, "one_pass", no_pass)
    return out


def test_an_acting_tick_returns_before_its_status_is_written(posted: list[str]) -> None:
    async def go() -> None:
        cfg = config.OperatorConfig(gateway_admin_url="http://127.0.0.1:1")
        client = SlowKube()
        rounds: list[int] = []

        async def observe(refs: Any) -> observed.Observed:
            rounds.append(len(refs))
            return _dropped()

        memo = kopf.Memo()
        memo["ctx"] = reconciler.Context(cfg, client)  # type: ignore[arg-type]
        memo["pass"] = observation.Pass(
            observation.Observation([], observe=observe, max_age_s=0.5, tls=None)
        )
        memo[overload_loop.LOOP_KEY] = ActingLoop(overload_driver.Driver(tls=None))
        patch = kopf.Patch()
        body = _body()

        await asyncio.wait_for(overload_loop.tick(body, patch, memo, cfg), timeout=5)
        assert not patch  # nothing left for kopf to apply before the next tick
        assert not memo["pass"].lock.locked()
        assert rounds == [2, 2]  # the tick's observation, and one after it acted
        assert posted.count("OverloadDropped") == 1
        assert client.writes == []  # still in flight

        # the body has not caught up: a second acting tick neither posts the drop again
        # nor writes what is already being written
        await asyncio.wait_for(overload_loop.tick(body, patch, memo, cfg), timeout=5)
        assert posted.count("OverloadDropped") == 1

        client.release.set()
        _, _, task = memo[overload_loop.STATUS_KEY]
        await asyncio.wait_for(task, timeout=5)
        assert len(client.writes) == 1
        url, doc = client.writes[0]
        assert url == "/apis/serving.tessera.dev/v1alpha1/namespaces/default/" + (
            "servingdeployments/tiny/status"
        )
        status = doc["status"]
        assert status["overload"]["groups"][0]["head"] == "d-r0"
        (cond,) = [c for c in status["conditions"] if c["type"] == "Overloaded"]
        assert (cond["status"], cond["reason"], cond["observedGeneration"]) == (
            "True",
            "LayersDropped",
            3,
        )

    asyncio.run(go())
