"""Autoscaling benchmark: the replica autoscaler vs a fixed count sized for the mean, in a burst.

`tessera bench autoscale --json` replays the first `--requests` of the shared trace (gaps
divided by `--time-scale`, lengths scaled as `tessera bench serve` does) on the tiny checkpoint,
the arrival rate x4 within `--burst`; greedy, streamed, times at the client. Two runs of
`tessera up` on their own local agents (one whole replica per agent): autoscale
(`--max-replicas` planned, `spec.scaling` on, min 1, sleep after `--sleep-after` s) and fixed
(ceil(L / queuePerReplica) awake, L by Little's law from the autoscaled run). Replica-seconds:
awake replicas (polled every 0.2 s) integrated over the replay. Keys:
p99_ttft_ms_{autoscale,fixed}, p50_ttft_ms_*, replica_seconds_*, fixed_replicas, sizing,
lost_*, wakes, sleeps.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tessera.bench import client, harness, local_up, options, trace
from tessera.cli import bench_overload_scenario, bench_serve
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

MODEL = "tiny-llama"
QUEUE_PER_REPLICA = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    bench_serve.add_arguments(parser)
    options.add_tls(parser)
    parser.set_defaults(requests=150, time_scale=1.5, max_output=32)
    parser.add_argument("--tiny", action="store_true", help="a few seconds' replay (tests)")
    parser.add_argument("--burst", type=float, nargs=2, default=(0.4, 0.6))
    parser.add_argument("--max-replicas", type=int, default=3)
    parser.add_argument("--sleep-after", type=float, default=4.0)
    parser.add_argument("--ttft-slo-ms", type=float, default=1000.0)


def _manifest(model: Path, replicas: int, scaling: dict[str, Any] | None, slo_ms: float) -> str:
    layout = [
        {"name": f"r{i}", "stages": [{"agent": f"agent-{i}", "device": "cpu:0", "layers": [0, 8]}]}
        for i in range(replicas)
    ]
    spec: dict[str, Any] = {
        "model": {"name": MODEL, "path": str(model)},
        "layout": {"mode": "explicit", "kvCacheBytes": 16 << 20, "replicas": layout},
        "slo": {"ttftP99Ms": slo_ms},
    }
    if scaling is not None:
        spec["scaling"] = scaling
    doc = {
        "apiVersion": "serving.tessera.dev/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": "auto"},
        "spec": spec,
    }
    return json.dumps(doc)  # JSON is YAML


async def _replay(url: str, reqs: list[tuple[float, int, int]], seed: int) -> dict[str, Any]:
    prompts = trace.prompts(reqs, random.Random(seed))
    streams = [client.Stream(p, out, at) for p, (at, _, out) in zip(prompts, reqs, strict=True)]
    t0 = await client.replay(url, MODEL, streams, timeout_s=600.0)
    ok = [st for st in streams if not st.error]
    return {
        "ttft": [st.ttft for st in ok if st.ttft is not None],
        "e2e": [st.finish - st.sent for st in ok],
        "failed": [st.error for st in streams if st.error],
        "wall_s": time.perf_counter() - t0,
    }


async def _awake(addresses: list[str], stop: asyncio.Event, tls: Any) -> list[tuple[float, int]]:
    """(time, awake replicas) every 0.2 s until `stop`: the agents' own report."""
    channels = [transport.channel(a, tls) for a in addresses]
    stubs = [pb_grpc.AgentStub(c) for c in channels]
    out: list[tuple[float, int]] = []
    try:
        while True:
            replies = await asyncio.gather(
                *(s.Describe(pb.DescribeRequest(), timeout=5) for s in stubs),
                return_exceptions=True,
            )
            n = sum(
                1
                for r in replies
                if not isinstance(r, BaseException)
                for k in r.kv
                if not k.sleeping
            )
            out.append((time.perf_counter(), n))
            if stop.is_set():
                return out
            await asyncio.sleep(0.2)
    finally:
        for c in channels:
            await c.close()


async def _measure(
    url: str, addresses: list[str], reqs: list[Any], seed: int, tls: Any
) -> dict[str, Any]:
    stop = asyncio.Event()
    poll = asyncio.ensure_future(_awake(addresses, stop, tls))
    t0 = time.perf_counter()
    got = await _replay(url, reqs, seed)
    stop.set()
    trace = await poll
    seconds = 0.0
    for (ta, n), (tb, _) in itertools.pairwise(trace):
        lo, hi = max(ta, t0), tb
        if hi > lo:
            seconds += n * (hi - lo)
    got["replica_seconds"] = seconds
    got["awake_max"] = max((n for _, n in trace), default=0)
    got["awake_min"] = min((n for _, n in trace), default=0)
    return got


def _up(
    tmp: Path, name: str, manifest: str, reqs: list[Any], seed: int, tls: Any
) -> dict[str, Any]:
    (tmp / f"{name}.yaml").write_text(manifest)
    with local_up.Up(tmp / f"{name}.yaml", "--devices", "cpu:1x1GiB", what="autoscale") as up:
        out = asyncio.run(_measure(up.url, up.agents(), reqs, seed, tls))
        out["log"] = up.log
    return out


def _pct(values: list[float], q: float) -> float:
    return round(harness.pct(values, q) * 1e3, 1)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tessera_agent import tiny_checkpoint as tc

    if args.tiny:
        args.requests, args.max_replicas, args.time_scale = 24, 2, 4.0
    reqs = trace.load(args)
    for _ in range(2):  # the rate x 4 in the burst window
        reqs = bench_overload_scenario.burst(reqs, *args.burst)
    scaling = {
        "enabled": True,
        "replicas": {"min": 1, "max": args.max_replicas},
        "idle": {"sleepAfterSeconds": args.sleep_after},
        "signals": {
            "queuePerReplica": QUEUE_PER_REPLICA,
            "scaleDownAfterSeconds": 6,
            "upCooldownSeconds": 1,
        },
    }
    with tempfile.TemporaryDirectory(prefix="tessera-bench-autoscale-") as tmp:
        model = tc.make_tiny(Path(tmp) / "tiny-llama", tc.TinySpec())
        auto = _up(
            Path(tmp),
            "auto",
            _manifest(model, args.max_replicas, scaling, args.ttft_slo_ms),
            reqs,
            args.seed,
            args.tls,
        )
        span = reqs[-1][0] or 1.0
        rate = len(reqs) / span
        service_s = statistics.median(auto["e2e"]) if auto["e2e"] else 1.0
        mean_load = rate * service_s
        fixed_n = min(args.max_replicas, max(1, math.ceil(mean_load / QUEUE_PER_REPLICA)))
        fixed = _up(
            Path(tmp),
            "fixed",
            _manifest(model, fixed_n, None, args.ttft_slo_ms),
            reqs,
            args.seed,
            args.tls,
        )
    said = [x for x in auto["log"] if "autoscale" in x]
    return {
        "p99_ttft_ms_autoscale": _pct(auto["ttft"], 99),
        "p99_ttft_ms_fixed": _pct(fixed["ttft"], 99),
        "p50_ttft_ms_autoscale": _pct(auto["ttft"], 50),
        "p50_ttft_ms_fixed": _pct(fixed["ttft"], 50),
        "replica_seconds_autoscale": round(auto["replica_seconds"], 1),
        "replica_seconds_fixed": round(fixed["replica_seconds"], 1),
        "awake_range_autoscale": [auto["awake_min"], auto["awake_max"]],
        "fixed_replicas": fixed_n,
        "sizing": {
            "mean_rate_rps": round(rate, 3),
            "median_e2e_s": round(service_s, 3),
            "mean_concurrency": round(mean_load, 3),
            "queue_per_replica": QUEUE_PER_REPLICA,
        },
        "lost_autoscale": len(auto["failed"]),
        "lost_fixed": len(fixed["failed"]),
        "failures": (auto["failed"] + fixed["failed"])[:5],
        "wakes": sum(1 for x in said if "ReplicaWoke" in x),
        "sleeps": sum(1 for x in said if "ReplicaSlept" in x),
        "wall_s": {"autoscale": round(auto["wall_s"], 1), "fixed": round(fixed["wall_s"], 1)},
        "requests": len(reqs),
        "trace": str(args.trace),
        "transforms": f"first {args.requests} requests, gaps / {args.time_scale}, rate x4 in "
        f"{list(args.burst)} of the replay; prompts clip(ContextTokens x {args.input_scale}, 1, "
        f"{args.max_input}), max_tokens clip(GeneratedTokens x {args.output_scale}, 1, "
        f"{args.max_output})",
        "setup": f"tessera up, {args.max_replicas} local agents x 1 whole-model replica "
        "(autoscale) vs the fixed count, tiny checkpoint, cpu",
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
    }
