"""The overload bench's replay on local agents: a least-outstanding router in this process
over the agents' `Generate` streams, and the product's overload loop beside it.

`run_once` starts 4 agents, loads a whole-model replica with the bench's small pool on
each, and `replay`s the rows (arrival time, prompt, output length) against them: greedy,
streamed. With `policy`, every `tick` seconds one pass runs the tick `tessera up` runs
(`up_overload.UpOverload.tick`: observe the agents, the level-triggered
`tessera.control.overload` loop decides and acts, report), the router supplying what a
gateway would: each replica's calls (`Router.calls`, ordered as `GET /admin/v1/load`) and
the routes steps (`Router.set_routes`: donors leave the set; their queued requests, no
token yet, go to a routable replica). Returns per-request times and tokens, what the
ticks reported (`Stats`) and the queue seen on the dropped heads.
Caller: `tessera.cli.bench_overload.run` (`--via replay`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from tessera.bench import harness, trace
from tessera.cli import bench_overload_bubble, local_agents, up_overload
from tessera.cli import bench_overload_scenario as scenario
from tessera.control import agents as control_agents
from tessera.control import gateway_load, observation
from tessera.control import overload as control
from tessera.policies.overload import drop_plan, lookahead
from tessera.policies.overload import held as overload_held
from tessera.policies.overload import monitor as overload
from tessera.policies.overload import steps as overload_steps
from tessera.rpc import sampling as rpc_sampling
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

LAYERS = 8  # the tiny checkpoint's; each agent holds one whole replica
RESTORE_WAIT_S = 120.0  # after the replay: how long the loop may take to restore


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

    def __init__(self, stubs: dict[str, pb_grpc.AgentStub]) -> None:
        self.stubs = stubs
        self.routable = list(stubs)
        self.on: dict[str, list[Req]] = {n: [] for n in stubs}

    def pick(self) -> str:
        return min(self.routable, key=lambda n: (len(self.on[n]), n))

    def calls(self) -> dict[str, tuple[gateway_load.Call, ...]]:
        """Each replica's requests as a gateway's `/admin/v1/load` lists its calls: those
        with no token first, then the longest without a token."""
        out = {}
        for name, on in self.on.items():
            ordered = sorted(on, key=lambda r: (r.first is not None, r.last or r.sent))
            out[name] = tuple(
                gateway_load.Call(len(r.prompt), r.max_tokens, r.first is not None) for r in ordered
            )
        return out

    async def set_routes(self, routes: overload_steps.Routes) -> None:
        # `close` / `reopen` are not modelled: this router knows no free pages, and the
        # gateway's rule (`policies/routing/closed`) gives a closed head way only to replicas
        # with room; the replay path keeps routing by count (docs/overload.md).
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


@dataclass
class Stats:
    """What the loop's ticks reported over one replay."""

    drops: int = 0
    restores: int = 0
    fallbacks: int = 0  # ticks whose plan fell back (no grouping frees enough)
    exchange_s: float = 0.0
    paused_s: float = 0.0
    events: list[str] = field(default_factory=list)  # "Reason: message", in order

    def add(self, out: control.Tick) -> None:
        self.drops += out.drops
        self.restores += out.restores
        self.exchange_s += out.exchange_s
        self.paused_s += out.paused_s
        self.fallbacks += sum(e.reason == drop_plan.REASON_UNREACHABLE for e in out.events)
        self.events += [f"{e.reason}: {e.message}" for e in out.events]
        if out.drops or out.restores:  # as the operator posts it
            self.events.append(
                f"OverloadShifted: {out.drops} drops, {out.restores} restores: exchange "
                f"{out.exchange_s * 1e3:.1f} ms, paused {out.paused_s * 1e3:.1f} ms"
            )

    def groups(self, before: overload_held.Held, now: overload_held.Held) -> None:
        """The groups the agents hold that they did not (dropped) and those gone (restored)."""
        was = {g.head for g in before.groups}
        for g in now.groups:
            if g.head not in was:
                layers = ", ".join(f"{s.member} [{s.start}, {s.end})" for s in g.stages)
                self.events.append(f"OverloadDropped: {layers}")
        heads = {g.head for g in now.groups}
        self.events += [f"OverloadRestored: {h}" for h in sorted(was - heads)]


async def replay(
    agents: list[local_agents.AgentProcess],
    reqs: list[tuple[float, int, int]],
    prompts: list[list[int]],
    policy: bool,
    tick_s: float,
) -> dict[str, Any]:
    tls = agents[0].tls
    channels = {a.address: transport.channel(a.address, a.tls) for a in agents}
    names = [f"r{i}" for i in range(len(agents))]
    stubs = {n: pb_grpc.AgentStub(channels[a.address]) for n, a in zip(names, agents, strict=True)}
    router = Router(stubs)
    # the deployment as `tessera up` holds it: agents, the whole replicas, one pass lock
    refs = [control_agents.AgentRef(f"agent-{i}", a.address) for i, a in enumerate(agents)]
    held = [
        overload_held.Member(n, ref.name, ref.address) for n, ref in zip(names, refs, strict=True)
    ]
    kept = control_agents.Channels(tls)
    deployment = observation.Pass(observation.Observation(refs, channels=kept, tls=tls))
    cfg = overload.OverloadConfig(enabled=True)
    ov = up_overload.UpOverload(
        held, cfg, LAYERS, router.calls, router.set_routes, lambda _: None, tls=tls
    )
    stats = Stats()
    seen_held = overload_held.Held()  # the groups as the last pass observed them
    queue_at_drop: list[int] = []
    shifts: list[list[float]] = []  # [tick start s, end s, drops, restores] of acting ticks
    rs = [Req(i, prompts[i], out) for i, (_, _, out) in enumerate(reqs)]
    start = time.perf_counter()
    stop = asyncio.Event()

    async def one_pass() -> overload_held.Held:
        """One tick as `tessera up` runs it; the groups the pass observed before acting."""
        nonlocal seen_held
        t0 = time.perf_counter()
        async with deployment.held() as seen:
            now = overload_held.read(held, await seen.get(), LAYERS)
            out = await ov.tick(seen)
        stats.groups(seen_held, now)
        stats.add(out)
        seen_held = now
        if out.drops or out.restores:
            t1 = time.perf_counter()
            shifts.append([round(t0 - start, 2), round(t1 - start, 2), out.drops, out.restores])
        return now

    def dropped(h: overload_held.Held) -> bool:
        return bool(h.groups or h.strays)

    async def run_loop() -> None:
        while not stop.is_set():
            now = await one_pass()
            # the deepest queue seen on the dropped heads, for the bubble model
            waiting = [r for g in now.groups for r in router.on[g.head] if r.first is None]
            if sum(len(r.prompt) for r in waiting) > sum(queue_at_drop):
                queue_at_drop[:] = [len(r.prompt) for r in waiting]
            try:
                await asyncio.wait_for(stop.wait(), tick_s)
            except TimeoutError:
                pass
        deadline = time.perf_counter() + RESTORE_WAIT_S
        # the replay ended dropped: restore before the agents stop
        while dropped(await one_pass()) and time.perf_counter() < deadline:
            await asyncio.sleep(tick_s)

    async def one(r: Req) -> None:
        await asyncio.sleep(max(0.0, reqs[r.i][0] - (time.perf_counter() - start)))
        r.sent = time.perf_counter()
        await router.send(r)

    ctl = asyncio.create_task(run_loop()) if policy else None
    await asyncio.gather(*(one(r) for r in rs))
    wall = time.perf_counter() - start
    stop.set()
    if ctl is not None:
        await ctl
    await ov.loop.close()
    await kept.close()
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
        "stats": stats,
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
    policy: bool,
) -> tuple[dict[str, Any], lookahead.ChunkCost | None]:
    agents = [
        scenario.start_agent(f"ovl-{'on' if policy else 'off'}-{i}", args.agent_nice)
        for i in range(4)
    ]
    try:
        for i, a in enumerate(agents):
            local_agents.load_pipeline(
                [a],
                str(rp.model),
                [(0, LAYERS)],
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
                policy,
                args.tick_ms / 1e3,
            )
        )
        return res, cost
    finally:
        for a in agents:
            local_agents.stop_agent(a)
