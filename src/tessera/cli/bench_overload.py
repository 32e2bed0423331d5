"""Overload benchmark (issue 13, KunServe): drop duplicated layers under a burst vs preempting.

`tessera bench overload --json [--requests N] [--time-scale X]` makes the tiny checkpoint,
starts 4 local agents, each serving a whole-model replica with a small declared KV pool
(`--pool-pages` pages), and replays the first N requests of the shared conversation trace
(time-compressed by X, by default so the burst offers `--overload-multiple` x the capacity
measured first: `bench_overload_scenario`; lengths scaled to the tiny model) with a burst:
the arrival rate is doubled for the requests in `--burst` (a window of the replay), which
overflows the pools. Greedy, streamed over the agents' `Generate`; a least-outstanding
router in this process. Two runs of the same replay on fresh agents:

* off: today's engine: a full pool preempts and recomputes (KV-centric);
* on: the overload loop (`tessera.control.overload_loop`, every `--tick-ms`) drops duplicated
  layers (whole replicas become 2-stage pipelines in place, running requests' KV
  exchanged, pools grown) and restores when demand falls below 50 % of the pre-drop pool.
  Donor replicas leave the router's set during a drop; requests still queued on them (no
  token yet) are re-sent to the group's head, running ones drain there.

Keys: p99_ttft_on_ms / p99_ttft_off_ms / p99_ttft_ratio (off / on), p50_tpot_on_vs_off
(on / off), drops, restores, lost (requests that did not complete, both runs), exchange_ms
(K/V exchange time summed over drops), paused_ms (the heads scheduled no step),
tokens_match (every output equals transformers' greedy decode of its prompt, both runs),
bubble_fraction_lookahead / bubble_fraction_token_count: the pipeline bubble MEASURED
live (`bench_overload_bubble`): the burst's requests queued at once on one in-process
2-stage pipeline whose leader splits microbatches by lookahead (equal modelled cost) or by
token count, alternating runs, per-stage busy time vs wall time; and, under
bubble_fraction_*_model, the same comparison as a MODEL output (`policies.lookahead`,
Eq. 1 fitted to this run's prefill timings, the deepest queue seen on a dropped group's
head). `--bubble-only` measures the live bubble alone (no replay).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tessera.bench import harness, options, oracle, trace
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

PAGE = 16


def add_arguments(parser: argparse.ArgumentParser) -> None:
    trace.add_arguments(
        parser,
        requests=160,
        input_scale=0.05,
        output_scale=0.1,
        max_input=48,
        max_output=24,
    )
    parser.add_argument(
        "--burst",
        type=float,
        nargs=2,
        default=(0.35, 0.75),
        help="the replay's fraction [a, b) whose arrival rate is doubled",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="divide the trace's arrival gaps by this (default: calibrated, --overload-multiple)",
    )
    parser.add_argument(
        "--overload-multiple",
        type=float,
        default=scenario.DEFAULT_MULTIPLE,
        help="the burst arrives at this multiple of the capacity measured first",
    )
    parser.add_argument("--calibration-requests", type=int, default=48)
    parser.add_argument("--pool-pages", type=int, default=6)
    parser.add_argument("--tick-ms", type=float, default=50.0)
    options.add_seed(parser)
    options.add_via(
        parser,
        "replay",
        "this process routes and runs the loop (as `tessera up`)",
        "the operator runs it against the test API server, requests go through a gateway",
    )
    parser.add_argument("--check-tokens", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--bubble-rounds", type=int, default=3, help="live bubble runs per split")
    parser.add_argument("--bubble-requests", type=int, default=24)
    parser.add_argument(
        "--bubble-only", action="store_true", help="measure the live bubble only (no replay)"
    )


def burst(reqs: list[tuple[float, int, int]], a: float, b: float) -> list[tuple[float, int, int]]:
    """Halve the arrival gaps of the requests in [a, b) of the replay (rate doubled there);
    later requests move earlier by the time saved."""
    i0, i1 = int(a * len(reqs)), int(b * len(reqs))
    out, shift = [], 0.0
    for i, (t, ci, co) in enumerate(reqs):
        if i0 < i < i1:
            gap = t - reqs[i - 1][0]
            shift += gap / 2
        out.append((t - shift, ci, co))
    return out


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
            overload.request_kv_bytes(len(r.prompt), r.max_tokens, PAGE, self.per_page)
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


async def _replay(
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


def _prefill_cost(agent: local_agents.AgentProcess, replica: str) -> lookahead.ChunkCost:
    """Eq. 1's alpha beta gamma fitted to measured prefill times (max_tokens 1, p = 0)."""
    stub = pb_grpc.AgentStub(transport.sync_channel(agent.address, agent.tls))
    samples = []
    for n in (4, 8, 16, 32, 48, 64) * 2:  # within the small pool
        t0 = time.perf_counter()
        local_agents.generate_tokens(stub, replica, [0] + [7] * (n - 1), 1)
        samples.append(lookahead.ChunkSample(0, n, time.perf_counter() - t0))
    return lookahead.fit_chunk_cost(samples)


def _bubbles(queue: list[int], cost: lookahead.ChunkCost) -> tuple[float, float, int]:
    chunks = [lookahead.Chunk(f"q{i}", 0, n) for i, n in enumerate(queue)]
    if sum(queue) < 2:
        return float("nan"), float("nan"), 0
    la = lookahead.lookahead_split(chunks, cost, min_tokens=8, max_microbatches=8)
    tc = lookahead.token_count_split(chunks, len(la))
    return lookahead.pipeline_bubble(la, cost, 2), lookahead.pipeline_bubble(tc, cost, 2), len(la)


def _run_once(
    replay: trace.Replay,
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
                str(replay.model),
                [(0, 8)],
                f"r{i}",
                args.pool_pages * per_page,
                data_plane=False,
            )
        cost = _prefill_cost(agents[0], "r0") if policy else None
        res = asyncio.run(
            _replay(
                agents,
                replay.reqs,
                replay.prompts,
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


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tessera_agent import tiny_checkpoint as tc
    from tessera_agent.engine import block_tensors, config, kv_cache
    from tessera_agent.engine import stage as stage_mod

    reqs = _rows(args, args.time_scale or 1.0)  # sizes; arrivals once the scale is chosen
    rng = random.Random(args.seed)
    prompts = [[0] + [rng.randrange(5, 500) for _ in range(n - 1)] for _, n, _ in reqs]
    with tempfile.TemporaryDirectory(prefix="tessera-overload-") as tmp:
        model = tc.make_tiny(Path(tmp) / "tiny-llama", tc.TinySpec())
        cfg = config.ModelConfig.from_path(model)
        per_page = kv_cache.KVLayout(8, 1, PAGE, cfg.num_kv_heads, cfg.head_dim).bytes_per_page
        dtype = stage_mod.torch_dtype("float32")
        layer_bytes = tuple(block_tensors.nbytes(cfg, i, i + 1, dtype) for i in range(8))
        i0 = int(args.burst[0] * len(reqs))
        sel = list(range(i0, min(len(reqs), i0 + args.bubble_requests)))
        b_prompts, b_news = [prompts[i] for i in sel], [reqs[i][2] for i in sel]
        bub = bench_overload_bubble.measure(model, b_prompts, b_news, args.bubble_rounds)
        if args.check_tokens:
            bub["bubble_tokens_match"] = bub["bubble_tokens"] == _reference(
                model, b_prompts, b_news
            )
        del bub["bubble_tokens"]
        if args.bubble_only:
            return {
                "bench": "overload",
                "machine": f"{platform.node()} ({os.cpu_count()} cpus)",
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                **bub,
            }
        reqs, scen = scenario.choose(
            args, model, args.pool_pages * per_page, lambda x: _rows(args, x)
        )
        replay = trace.Replay(model, reqs, prompts)
        if args.via == "operator":
            return {**_via_operator(replay, args, per_page, bub), **scen}
        off, _ = _run_once(replay, args, per_page, layer_bytes, False)
        on, cost = _run_once(replay, args, per_page, layer_bytes, True)
        match = None
        if args.check_tokens:
            want = _reference(model, prompts, [o for _, _, o in reqs])
            match = all(
                r.tokens == w
                for res in (off, on)
                for r, w in zip(res["requests"], want, strict=True)
                if r.done
            )
    stats: overload_loop.LoopStats = on["stats"]
    assert cost is not None
    la, tcb, mbs = _bubbles(on["queue_at_drop"], cost)
    return {
        "bench": "overload",
        **_compared(args, len(reqs), off, on),
        "drops": stats.drops,
        "restores": stats.restores,
        "fallbacks": stats.fallbacks,
        "lost": on["lost"] + off["lost"],
        "exchange_ms": round(stats.exchange_s * 1e3, 1),
        "paused_ms": round(stats.paused_s * 1e3, 1),
        "tokens_match": match,
        "wall_on_s": round(on["wall_s"], 1),
        "wall_off_s": round(off["wall_s"], 1),
        **bub,
        "bubble_fraction_lookahead_model": round(la, 3),
        "bubble_fraction_token_count_model": round(tcb, 3),
        "bubble_model_basis": (
            f"model: Eq. 1 fitted to this run's prefill timings (alpha={cost.alpha:.3g}, "
            f"beta={cost.beta:.3g}, gamma={cost.gamma:.3g}), the deepest queue while dropped "
            f"({len(on['queue_at_drop'])} prompts) in {mbs} microbatches on 2 stages"
        ),
        "events": [f"{e.reason}: {e.message}" for e in stats.events][:8],
        "shifts_on_s": on["shifts"],
        **scen,
    }


def _rows(args: argparse.Namespace, scale: float) -> list[tuple[float, int, int]]:
    """The replay's rows at time scale `scale`, the burst applied."""
    return burst(trace.load(argparse.Namespace(**{**vars(args), "time_scale": scale})), *args.burst)


def _reference(model: Path, prompts: list[list[int]], news: list[int]) -> list[list[int]]:
    """transformers' greedy tokens of each prompt (EOS ignored)."""
    return oracle.greedy_tokens(model, list(zip(prompts, news, strict=True)))


def _compared(
    args: argparse.Namespace, requests: int, off: dict[str, Any], on: dict[str, Any]
) -> dict[str, Any]:
    """The keys both paths report first: the run, and latency with the policy on vs off."""
    return {
        "machine": f"{platform.node()} ({os.cpu_count()} cpus)",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "requests": requests,
        "replicas": 4,
        "pool_pages": args.pool_pages,
        "page_size": PAGE,
        "p99_ttft_on_ms": round(on["p99_ttft_ms"], 1),
        "p99_ttft_off_ms": round(off["p99_ttft_ms"], 1),
        "p99_ttft_ratio": round(off["p99_ttft_ms"] / on["p99_ttft_ms"], 2),
        "p50_ttft_on_ms": round(on["p50_ttft_ms"], 1),
        "p50_ttft_off_ms": round(off["p50_ttft_ms"], 1),
        "p50_tpot_on_vs_off": round(on["p50_tpot_ms"] / off["p50_tpot_ms"], 2),
        "ttft_slowest_off": off["slowest"],
        "ttft_slowest_on": on["slowest"],
    }


def _via_operator(
    replay: trace.Replay,
    args: argparse.Namespace,
    per_page: int,
    bub: dict[str, Any],
) -> dict[str, Any]:
    """Both runs through the operator and a gateway (`bench_overload_operator`); the keys
    of the replay path, the bubble model's left out (no queue is seen from here)."""
    from tessera.cli import bench_overload_operator as via

    kv = args.pool_pages * per_page
    off = via.run_once(replay, kv, False, args.tick_ms / 1e3)
    on = via.run_once(replay, kv, True, args.tick_ms / 1e3)
    match = None
    if args.check_tokens:
        outs = [o for _, _, o in replay.reqs]
        texts = oracle.greedy_texts(replay.model, list(zip(replay.prompts, outs, strict=True)))
        match = all(
            r.text == w
            for res in (off, on)
            for r, w in zip(res["requests"], texts, strict=True)
            if r.ok
        )
    return {
        "bench": "overload",
        "via": "operator",
        **_compared(args, len(replay.reqs), off, on),
        "drops": on["drops"],
        "restores": on["restores"],
        "fallbacks": on["fallbacks"],
        "lost": on["lost"] + off["lost"],
        "exchange_ms": round(on["exchange_ms"], 1),
        "paused_ms": round(on["paused_ms"], 1),
        "tokens_match": match,
        "wall_on_s": round(on["wall_s"], 1),
        "wall_off_s": round(off["wall_s"], 1),
        **bub,
        "bubble_fraction_lookahead_model": None,
        "bubble_fraction_token_count_model": None,
        "bubble_model_basis": "not computed via the operator (no queue is seen here)",
        "events": on["events"][:8],
        "shifts_on_s": None,
    }
