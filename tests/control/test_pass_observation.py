"""One pass at a time per deployment, and one observation of the agents per pass.

`tessera.control.observation.Pass` is the deployment's pass lock and the observation its
holder shares. Checked here: an observation is made once per pass and again only after
an actuator acted; `tessera up`'s module-scaling tick (`up_policies.run_locked`) and a
converge pass (`up_overload.guarded`) never interleave, a cancelled tick keeping the lock
until its thread is done; and a converge pass followed by the overload tick in the same
pass asks a fake agent for `Describe` once, where the pass and the tick each asked before.
"""

from __future__ import annotations

import asyncio
import threading
import time
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc

from tessera import api, observed
from tessera.cli import up_overload, up_policies
from tessera.control import agents, converge, observation
from tessera.control import overload as control
from tessera.policies.overload import monitor as overload
from tessera.policies.scaling import module_scaling
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc


class CountingAgent(pb_grpc.AgentServicer):  # type: ignore[misc]
    """An agent with one empty CPU device that counts the `Describe` calls it answers."""

    def __init__(self) -> None:
        self.describes = 0

    async def Describe(self, request: Any, context: Any) -> pb.DescribeReply:
        self.describes += 1
        return pb.DescribeReply(
            devices=[pb.Device(id="cpu:0", kind="cpu", capacity_bytes=2 << 30, free_bytes=2 << 30)]
        )


async def _agent() -> tuple[grpc.aio.Server, CountingAgent, str]:
    srv = transport.server()
    agent = CountingAgent()
    pb_grpc.add_AgentServicer_to_server(agent, srv)
    port = transport.add_port(srv, "127.0.0.1:0", tls=None)
    await srv.start()
    return srv, agent, f"127.0.0.1:{port}"


def _manifest(model: Path) -> dict[str, Any]:
    def replica(name: str, agent: str) -> dict[str, Any]:
        return {"name": name, "stages": [{"agent": agent, "device": "cpu:0", "layers": [0, 8]}]}

    return {
        "apiVersion": "serving.tessera.dev/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": "tiny", "namespace": "default", "generation": 1},
        "spec": {
            "model": {"name": "tiny-llama", "path": str(model), "dtype": "float32"},
            "layout": {
                "mode": "explicit",
                "kvCacheBytes": 16 << 20,
                "replicas": [replica("r0", "a0"), replica("r1", "a1")],
            },
            "slo": {"ttftP99Ms": 2000, "tpotP99Ms": 200},
            "gateway": {"port": 8000, "replicas": 1},
        },
    }


def test_an_observation_is_made_once_per_pass_and_again_after_an_actuator_acted() -> None:
    calls: list[tuple[str, ...]] = []

    async def observe(refs: Any) -> observed.Observed:
        calls.append(tuple(r.name for r in refs))
        return observed.Observed(())

    async def go() -> None:
        p = observation.Pass(
            observation.Observation([agents.AgentRef("a0", "x:1")], observe, tls=None)
        )
        async with p.held() as seen:
            first = await seen.get()
            assert await seen.get() is first and len(calls) == 1  # shared in the pass
            seen.acted()
            assert await seen.get() is not first and len(calls) == 2
        async with p.held() as seen:  # a new pass: time has passed, observe afresh
            await seen.get()
            await seen.get()
        assert calls == [("a0",)] * 3 and p.observation.observations == 3

    asyncio.run(go())


class SlowLoop:
    """A module-scaling loop whose tick blocks (as its gRPC calls do) and logs its span."""

    def __init__(self, log: list[str]) -> None:
        self.log, self.ticks = log, 0
        self.started = threading.Event()

    def tick(self) -> list[str]:
        self.log.append("tick>")
        self.started.set()
        time.sleep(0.02)
        self.ticks += 1
        self.log.append("<tick")
        return ["r0: replicated 1 layers"]


def _nested(log: list[str]) -> bool:
    """Every span in `log` ends before the next one starts."""
    return all(
        log[i].endswith(">") and log[i + 1] == "<" + log[i][:-1] for i in range(0, len(log), 2)
    )


def test_a_scaling_tick_and_a_converge_pass_never_interleave() -> None:
    log: list[str] = []
    loop = SlowLoop(log)

    async def go() -> None:
        p = observation.Pass(
            observation.Observation(
                [], lambda refs: asyncio.sleep(0, observed.Observed(())), tls=None
            )
        )
        stop = asyncio.Event()
        said: list[str] = []
        task = asyncio.create_task(
            up_policies.run_locked(loop, stop, 0.001, said.append, p)  # type: ignore[arg-type]
        )

        async def one_pass(current: Any, seen: observation.Observation) -> bool:
            log.append("pass>")
            await seen.get()
            await asyncio.sleep(0.015)  # the pass awaits its agents: a tick could run now
            log.append("<pass")
            return False

        run = up_overload.guarded(p, one_pass)
        for _ in range(8):
            await run(None)
            await asyncio.sleep(0.005)
        stop.set()
        await asyncio.wait_for(task, 5.0)
        assert said and said[0] == "r0: replicated 1 layers"

    asyncio.run(go())
    assert loop.ticks >= 2 and log.count("pass>") == 8, log
    assert _nested(log), log


def test_a_cancelled_scaling_tick_holds_the_lock_until_its_thread_is_done() -> None:
    log: list[str] = []
    loop = SlowLoop(log)

    async def go() -> None:
        p = observation.Pass(observation.Observation([], tls=None))
        task = asyncio.create_task(
            up_policies.run_locked(loop, asyncio.Event(), 0.001, log.append, p)  # type: ignore[arg-type]
        )
        await asyncio.to_thread(loop.started.wait, 5.0)
        task.cancel()  # the manifest turned scaling off, or `tessera up` exits
        async with p.held():
            log.append("pass>")
        assert task.cancelled() or task.done()

    asyncio.run(go())
    assert log[:3] == ["tick>", "<tick", "pass>"], log


class _Gateway:
    config = types.SimpleNamespace(tls=None)  # plaintext, as the agents

    def in_flight(self, replica_id: str) -> list[Any]:
        return []


def test_a_pass_and_the_overload_tick_in_it_describe_each_agent_once(tiny_llama: Path) -> None:
    """`tessera up`'s pass (`up_cmd.one_pass`): converge, then the overload tick over the
    pass's observation. One `Describe` per agent; before, the tick observed again."""
    dep = api.parse(_manifest(tiny_llama))

    async def go() -> None:
        started = [await _agent(), await _agent()]
        refs = [agents.AgentRef(f"a{i}", addr) for i, (_, _, addr) in enumerate(started)]
        try:
            p = observation.Pass(observation.Observation(refs, tls=None))
            async with p.held() as seen:
                out = await converge.converge(
                    dep, str(tiny_llama), refs, apply=False, shared=seen, tls=None
                )
                assert out.plan is not None and out.observed is not None, out.message
                ov = up_overload.beside_gateway(
                    out.plan,
                    out.observed,
                    overload.OverloadConfig(enabled=True),
                    8,
                    _Gateway(),  # type: ignore[arg-type]
                    lambda: out.routes,  # type: ignore[arg-type, return-value]
                    lambda line: None,
                )
                ticked: list[observed.Observed] = []

                async def tick(
                    held: Any, cfg: Any, num_layers: int, obs: observed.Observed, calls: Any
                ) -> control.Tick:
                    ticked.append(obs)
                    return control.Tick()

                ov.loop.tick = tick  # type: ignore[method-assign, assignment]
                await ov.tick(seen)
                assert ticked == [out.observed]  # the pass's own observation
            assert [a.describes for _, a, _ in started] == [1, 1]
            async with p.held() as seen:  # the next pass observes again
                await ov.tick(seen)
            assert [a.describes for _, a, _ in started] == [2, 2]
            await ov.loop.close()
        finally:
            for srv, _, _ in started:
                await srv.stop(grace=None)

    asyncio.run(go())


def test_up_scaling_policy_sync_says_when_it_evicted() -> None:
    """`ScalingPolicy.sync` returns True when turning the loop off evicted layer replicas
    (the pass then drops its observation: the agents changed)."""
    made: list[Any] = []

    class Loop:
        def reconfigure(self, cfg: Any, target: float) -> None:
            pass

        def release(self) -> list[str]:
            return ["evicted"]

    def spec(enabled: bool) -> Any:
        return SimpleNamespace(
            policies=SimpleNamespace(scaling=module_scaling.ScalingConfig(enabled=enabled)),
            slo=api.SLOSpec(tpot_p99_ms=50.0),
        )

    async def go() -> None:
        async def idle(lp: Any) -> None:
            await asyncio.Event().wait()

        def make(s: Any) -> Any:
            made.append(s)
            return Loop()

        policy = up_policies.ScalingPolicy(make, idle, print)
        assert await policy.sync(spec(True)) is False and made
        assert await policy.sync(spec(False)) is True
        assert await policy.sync(spec(False)) is False

    asyncio.run(go())
