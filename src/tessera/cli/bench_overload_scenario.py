"""How overloaded `tessera bench overload`'s burst is: a multiple of the measured capacity.

Rule: before the replay, 4 fresh agents each load a whole replica with the bench's pool
(the off run's deployment) and `calibrate` sends `--calibration-requests` rows of the
replay (every k-th row's sizes, fresh random prompts) at once, a quarter to each, after one
untimed warm-up request per replica; capacity = requests / wall seconds (saturated, a full
pool preempting). `time_scale_for` then picks the replay's time scale so the burst window
(`--burst`, after `burst`) arrives at `--overload-multiple` (default 2.5) x that capacity;
the rest of the trace keeps its shape at half that rate. One scale for the off and on
runs and for both paths (`--via replay`, `--via operator`); `--time-scale` given wins (no
calibration). `slowest` names the requests that make a run's p99 TTFT.
Caller: `tessera.cli.bench_overload.run`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.bench import trace
from tessera.cli import local_agents
from tessera.rpc import sampling as rpc_sampling
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

PAGE = 16  # tokens per KV page of the bench's agents
DEFAULT_MULTIPLE = 2.5
# The runs' agents yield the CPU to the processes serving their requests (the gateway, the
# operator and its API server, this client): on a cluster those have CPUs of their own,
# while here 4 compute-bound agents share 2 cores with them, and at an overloaded burst's
# peak the gateway's event loop lagged up to 212 ms, first tokens reaching the client up to
# 0.6 s after the agents sent them (docs/overload.md).
AGENT_NICE = 10
WARMUP_TOKENS = 4


@dataclass(frozen=True)
class Capacity:
    """What the calibration measured: requests it completed, in how long."""

    requests: int
    wall_s: float
    tokens: int

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.wall_s


def window_rate(reqs: Sequence[trace.Row], a: float, b: float) -> float:
    """Arrivals per second of the requests in [a, b) of the replay (after `burst`)."""
    i0, i1 = int(a * len(reqs)), int(b * len(reqs))
    if i1 - i0 < 2:
        raise ValueError(f"burst window [{a}, {b}) holds fewer than 2 of {len(reqs)} requests")
    span = reqs[i1 - 1][0] - reqs[i0][0]
    if span <= 0:
        raise ValueError("the burst window's requests arrive at one instant")
    return (i1 - i0 - 1) / span


def time_scale_for(
    reqs: Sequence[trace.Row],
    scale: float,
    a: float,
    b: float,
    capacity_rps: float,
    multiple: float,
) -> float:
    """The time scale at which the burst window of `reqs` (loaded at time scale `scale`)
    arrives at `multiple` x `capacity_rps`: arrival rates grow linearly with the scale."""
    if capacity_rps <= 0 or multiple <= 0:
        raise ValueError(f"capacity {capacity_rps} and multiple {multiple} must be > 0")
    return scale * multiple * capacity_rps / window_rate(reqs, a, b)


def sample(reqs: Sequence[trace.Row], n: int, seed: int) -> list[tuple[list[int], int]]:
    """`n` requests of the replay's mix (every k-th row's sizes), fresh random prompts."""
    step = max(1, len(reqs) // max(1, n))
    rows = list(reqs[::step])[:n]
    rng = random.Random(seed + 1)  # not the replay's prompts: no prefix cache hit
    return [([0] + [rng.randrange(5, 500) for _ in range(p - 1)], o) for _, p, o in rows]


def start_agent(name: str, nice: int) -> local_agents.AgentProcess:
    """One of a run's 4 agents: one CPU thread, a 256 MiB device, niceness `nice`."""
    return local_agents.start_agent(name, "cpu:1x256MiB", 1, nice=nice)


def calibrate(
    model: Path, reqs: Sequence[trace.Row], kv_bytes: int, n: int, seed: int, nice: int = 0
) -> Capacity:
    """Capacity of 4 whole replicas of `kv_bytes` pools on fresh agents (module docstring),
    the agents at niceness `nice` as in the runs."""
    agents = [start_agent(f"ovl-cal-{i}", nice) for i in range(4)]
    try:
        for i, a in enumerate(agents):
            local_agents.load_pipeline(
                [a], str(model), [(0, 8)], f"r{i}", kv_bytes, data_plane=False
            )
        return asyncio.run(_saturate(agents, sample(reqs, n, seed)))
    finally:
        for a in agents:
            local_agents.stop_agent(a)


async def _saturate(
    agents: Sequence[local_agents.AgentProcess], work: list[tuple[list[int], int]]
) -> Capacity:
    channels = [transport.channel(a.address, a.tls) for a in agents]
    stubs = [pb_grpc.AgentStub(c) for c in channels]

    async def one(i: int, prompt: list[int], n: int) -> int:
        params = rpc_sampling.to_proto(rpc_sampling.Sampling(max_tokens=n, ignore_eos=True))
        req = pb.GenerateRequest(replica_id=f"r{i % 4}", prompt_token_ids=prompt, params=params)
        got = 0
        async for ch in stubs[i % 4].Generate(req, timeout=600):
            got += len(ch.token_ids)
        if got != n:
            raise RuntimeError(f"calibration request {i}: {got} of {n} tokens")
        return got

    try:
        await asyncio.gather(*(one(i, [0] + [7] * 47, WARMUP_TOKENS) for i in range(4)))
        t0 = time.perf_counter()
        tokens = await asyncio.gather(*(one(i, p, o) for i, (p, o) in enumerate(work)))
        wall = time.perf_counter() - t0
    finally:
        for c in channels:
            await c.close()
    return Capacity(len(work), wall, sum(tokens))


def choose(
    args: argparse.Namespace,
    model: Path,
    kv_bytes: int,
    rows_at: Callable[[float], list[trace.Row]],
) -> tuple[list[trace.Row], dict[str, Any]]:
    """The replay's rows (`rows_at(time scale)`, the burst applied) at `args.time_scale`, or
    calibrated (module docstring), and the JSON keys that say which."""
    if args.time_scale is not None:
        reqs = rows_at(args.time_scale)
        keys: dict[str, Any] = {
            "time_scale": args.time_scale,
            "calibration": None,
            "overload_multiple": None,
        }
    else:
        a, b = args.burst
        cap = calibrate(
            model,
            rows_at(1.0),
            kv_bytes,
            args.calibration_requests,
            args.seed,
            args.agent_nice,
        )
        scale = time_scale_for(rows_at(1.0), 1.0, a, b, cap.requests_per_s, args.overload_multiple)
        reqs = rows_at(scale)
        keys = {
            "time_scale": round(scale, 3),
            "calibration": {
                "requests": cap.requests,
                "wall_s": round(cap.wall_s, 3),
                "requests_per_s": round(cap.requests_per_s, 2),
                "tokens_per_s": round(cap.tokens / cap.wall_s, 1),
            },
            "overload_multiple": args.overload_multiple,
        }
    keys["burst_rate_rps"] = round(window_rate(reqs, *args.burst), 2)
    return reqs, keys


def slowest(
    arrivals: Sequence[float], ttfts: Sequence[float | None], k: int = 3
) -> list[list[float]]:
    """The `k` requests of longest TTFT as [arrival s, TTFT ms] (p99 of 160 is the third)."""
    pairs = [(t, a) for a, t in zip(arrivals, ttfts, strict=True) if t is not None]
    return [[round(a, 2), round(t * 1e3, 1)] for t, a in sorted(pairs, reverse=True)[:k]]


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
