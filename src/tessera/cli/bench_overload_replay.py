"""The overload bench's replay on local agents: a least-outstanding router in this process
over the agents' `Generate` streams, and the overload loop beside it.

`run_once` starts 4 agents, loads a whole-model replica with the bench's small pool on
each, and `replay`s the rows (arrival time, prompt, output length) against them: greedy,
streamed; with `policy` the loop (`tessera.control.overload_loop`, every `tick` seconds)
drops and restores layers through `overload_driver`, and the router follows its routes
(donors leave the set; their queued requests, no token yet, go to the group's head).
Returns per-request times and tokens, the loop's stats and the queue seen at each drop.
Caller: `tessera.cli.bench_overload.run` (`--via replay`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from tessera.bench import harness, trace
from tessera.cli import bench_overload_bubble, local_agents
from tessera.cli import bench_overload_scenario as scenario
from tessera.control import overload_driver, overload_loop
from tessera.policies.overload import lookahead
from tessera.policies.overload import monitor as overload
from tessera.policies.overload import steps as overload_steps
from tessera.rpc import sampling as rpc_sampling
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc


@dataclass
class Req:
    i: int
    prompt: list[int]
    max_tokens: int
    replica: str = ""
    sent: float = 0.0
    first: float | None = None
    last: float | None = None
    tokens: list[int] = field(default_factory=list)
    done: bool = False
    task: asyncio.Task[None] | None = None


class Router:
    """Least-outstanding routing over the routable replicas; knows each replica's queue."""

    def __init__(self, stubs: dict[str, pb_grpc.AgentStub], per_page: int) -> None:
        self.stubs, self.per_page = stubs, per_page
        self.routable = list(stubs)
        self.on: dict[str, list[Req]] = {n: [] for n in stubs}
        self.head_of: dict[str, str] = {}  # donor -> head while dropped

    def pick(self) -> str:
        return min(self.routable, key=lambda n: (len(self.on[n]), n))

    def queued_bytes(self, name: str) -> list[int]:
        return [
            overload.request_kv_bytes(len(r.prompt), r.max_tokens, scenario.PAGE, self.per_page)
            for r in self.on[name]
            if r.first is None
        ]

    async def set_routes(self, routes: overload_steps.Routes) -> None:
        for n in routes.add:
            if n not in self.routable:
                self.routable.append(n)
        for n in routes.remove:
            if n in self.routable:
                self.routable.remove(n)
            for r in self.on[n]:
                if r.first is None and r.task is not None:
                    r.task.cancel()  # queued, nothing generated: re-sent to a routable replica

    async def send(self, r: Req) -> None:
        while True:
            name = self.pick()
            r.replica = name
            self.on[name].append(r)
            params = rpc_sampling.to_proto(
                rpc_sampling.Sampling(max_tokens=r.max_tokens, ignore_eos=True)
            )
            req = pb.GenerateRequest(replica_id=name, prompt_token_ids=r.prompt, params=params)
            r.task = asyncio.current_task()
            try:
                async for ch in self.stubs[name].Generate(req, timeout=600):
                    now = time.perf_counter()
                    if ch.token_ids:
                        if r.first is None:
                            r.first = now
                        r.last = now
                        r.tokens.extend(ch.token_ids)
                r.done = len(r.tokens) == r.max_tokens
                return
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if r.first is not None or task is None or not task.uncancel() == 0:
                    raise
                continue  # moved off a donor before its first token
            except grpc.aio.AioRpcError:
                return
            finally:
                self.on[name].remove(r)


async def replay(
    agents: list[local_agents.AgentProcess],
    reqs: list[tuple[float, int, int]],
    prompts: list[list[int]],
    per_page: int,
    layer_bytes: tuple[int, ...],
    policy: bool,
    tick_s: float,
) -> dict[str, Any]:
    channels = {a.address: transport.channel(a.address, a.tls) for a in agents}
    names = [f"r{i}" for i in range(len(agents))]
    stubs = {n: pb_grpc.AgentStub(channels[a.address]) for n, a in zip(names, agents, strict=True)}
    router = Router(stubs, per_page)
    members = {n: overload_steps.Member(n, a.address) for n, a in zip(names, agents, strict=True)}
    driver = overload_driver.Driver(router.set_routes, chunk_pages=4, tls=agents[0].tls)

    async def describe(addr: str) -> pb.DescribeReply:
        reply: pb.DescribeReply = await pb_grpc.AgentStub(channels[addr]).Describe(
            pb.DescribeRequest(), timeout=10
        )
        return reply

    cfg = overload.OverloadConfig(enabled=True)
    loop = overload_loop.OverloadLoop(
        members, cfg, layer_bytes, per_page, router.queued_bytes, driver, describe
    )
    queue_at_drop: list[int] = []
    shifts: list[list[float]] = []  # [tick start s, end s, drops, restores] of acting ticks
    rs = [Req(i, prompts[i], out) for i, (_, _, out) in enumerate(reqs)]
    start = time.perf_counter()
    stop = asyncio.Event()

    async def timed_tick() -> None:
        t0, before = time.perf_counter(), (loop.stats.drops, loop.stats.restores)
        await loop.tick()
        done = (loop.stats.drops - before[0], loop.stats.restores - before[1])
        if any(done):
            t1 = time.perf_counter()
            shifts.append([round(t0 - start, 2), round(t1 - start, 2), *done])

    async def control() -> None:
        while not stop.is_set():
            await timed_tick()
            if loop.dropped:  # the deepest queue seen while dropped, for the bubble model
                heads = [r for d in loop.dropped for r in router.on[d] if r.first is None]
                if sum(len(r.prompt) for r in heads) > sum(queue_at_drop):
                    queue_at_drop[:] = [len(r.prompt) for r in heads]
            try:
                await asyncio.wait_for(stop.wait(), tick_s)
            except TimeoutError:
                pass
        while loop.dropped:  # the replay ended dropped: restore before the agents stop
            await timed_tick()
            await asyncio.sleep(tick_s)

    async def one(r: Req) -> None:
        await asyncio.sleep(max(0.0, reqs[r.i][0] - (time.perf_counter() - start)))
        r.sent = time.perf_counter()
        await router.send(r)

    ctl = asyncio.create_task(control()) if policy else None
    await asyncio.gather(*(one(r) for r in rs))
    wall = time.perf_counter() - start
    stop.set()
    if ctl is not None:
        await ctl
    await driver.close()
    for ch in channels.values():
        await ch.close()
    ttft = [r.first - r.sent for r in rs if r.first is not None]
    tpot = [
        (r.last - r.first) / (len(r.tokens) - 1)
        for r in rs
        if r.first is not None and r.last is not None and len(r.tokens) > 1
    ]
    return {
        "requests": rs,
        "wall_s": wall,
        **harness.latency_ms(ttft, tpot),
        "lost": sum(not r.done for r in rs),
        "stats": loop.stats,
        "queue_at_drop": queue_at_drop,
        "slowest": scenario.slowest(
            [r.sent - start for r in rs],
            [None if r.first is None else r.first - r.sent for r in rs],
        ),
        "shifts": shifts,
    }


def run_once(
    rp: trace.Replay,
    args: Any,
    per_page: int,
    layer_bytes: tuple[int, ...],
    policy: bool,
) -> tuple[dict[str, Any], lookahead.ChunkCost | None]:
    agents = [
        local_agents.start_agent(f"ovl-{'on' if policy else 'off'}-{i}", "cpu:1x256MiB", 1)
        for i in range(4)
    ]
    try:
        for i, a in enumerate(agents):
            local_agents.load_pipeline(
                [a],
                str(rp.model),
                [(0, 8)],
                f"r{i}",
                args.pool_pages * per_page,
                data_plane=False,
            )
        cost = bench_overload_bubble.prefill_cost(agents[0], "r0") if policy else None
        res = asyncio.run(
            replay(
                agents,
                rp.reqs,
                rp.prompts,
                per_page,
                layer_bytes,
                policy,
                args.tick_ms / 1e3,
            )
        )
        return res, cost
    finally:
        for a in agents:
            local_agents.stop_agent(a)
