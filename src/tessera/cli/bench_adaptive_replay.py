"""The replay and the server of `tessera bench adaptive`: classes, phases, client, manifest.

`Workload` types the shared trace's requests (token counts scaled as in `bench serve`)
into two k-means classes, "short" and "long" prompts, and hands them out in trace order
without reuse; `make_spans` builds time-compressed spans whose long-class share is given
per span (`phase_shares`: low and high alternately, in phases). `Server` drives the
running `tessera up`: replays requests on their schedule (streamed, greedy, each
request's latency from send to its last token) and switches the layout by rewriting the
manifest, waiting until the gateway routes only the new replicas. Called by
`tessera.cli.bench_adaptive`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.bench import client, harness, local_up, trace
from tessera.cli import bench_relayout

CANDIDATES = (0, 1)  # indices into bench_relayout.LAYOUTS; the first one serves first


# -- the replay ------------------------------------------------------------------------
@dataclass
class Req(client.Stream):
    cls: int = 0  # the request's class: 0 "short", 1 "long"


class Workload:
    """Two k-means classes of the scaled trace ("short" and "long" prompts) and, per class,
    the trace's requests in order, drawn without reuse (calibration first, then replay)."""

    def __init__(self, args: argparse.Namespace) -> None:
        from tessera.workload import classes, traces

        rows = trace.load(
            argparse.Namespace(**{**vars(args), "requests": 10**9, "time_scale": 1.0})
        )
        reqs = [traces.Request(at, n, out) for at, n, out in rows]
        fitted = classes.fit_classes(reqs, k=2, seed=args.seed)
        labels = fitted.classify_many(
            [r.input_tokens for r in reqs], [r.output_tokens for r in reqs]
        )
        order = sorted(range(2), key=lambda c: fitted.centroids[c].input_tokens)
        self.names = ["short", "long"]
        self.pools = [
            [(r.input_tokens, r.output_tokens) for r, c in zip(reqs, labels, strict=True) if c == k]
            for k in order
        ]
        self.centroids = [
            (
                max(1, round(fitted.centroids[k].input_tokens)),
                max(1, round(fitted.centroids[k].output_tokens)),
            )
            for k in order
        ]
        self.used = [0, 0]

    def draw(self, cls: int) -> tuple[int, int]:
        pool = self.pools[cls]
        item = pool[self.used[cls] % len(pool)]
        self.used[cls] += 1
        return item


def make_spans(
    w: Workload, shares: list[float], args: argparse.Namespace, rng: random.Random
) -> list[Req]:
    """Requests of consecutive spans, span k with the long class at share `shares[k]`."""
    out = []
    n = max(1, round(args.rate * args.span))
    for k, share in enumerate(shares):
        for t in sorted(rng.uniform(0, args.span) for _ in range(n)):
            cls = 1 if rng.random() < share else 0
            inp, outp = w.draw(cls)
            prompt = [rng.randrange(5, 500) for _ in range(inp)]
            out.append(Req(prompt, outp, k * args.span + t, cls=cls))
    return out


def phase_shares(args: argparse.Namespace, spans: int) -> list[float]:
    """Long-class share per span: low, high, low, ... in phases of `phase_spans`."""
    return [
        args.low_share if (k // args.phase_spans) % 2 == 0 else args.high_share
        for k in range(spans)
    ]


def _copy(reqs: list[Req]) -> list[Req]:
    return [Req(list(r.prompt), r.max_tokens, r.at, cls=r.cls) for r in reqs]


def summary(reqs: list[Req]) -> dict[str, Any]:
    """P99/P50 request latency and generated tokens per second of one run."""
    done = [r for r in reqs if r.ok]
    lat = [r.finish - r.sent for r in done]
    end = max((r.finish for r in done), default=0.0)
    first = min((r.sent for r in reqs if r.sent), default=0.0)
    return {
        "requests": len(reqs),
        "completed": len(done),
        "p99_latency_s": round(harness.pct(lat, 99), 4),
        "p50_latency_s": round(harness.pct(lat, 50), 4),
        "tokens_per_s": round(sum(r.max_tokens for r in done) / (end - first), 3)
        if end > first
        else 0.0,
    }


def write_manifest(path: Path, model: Path, layout: int, w: Workload) -> None:
    """`bench_relayout`'s manifest of a layout, with the two classes as the workload (the
    gateway types arrivals by them)."""
    doc = bench_relayout.manifest(model, layout)
    doc["spec"]["workload"] = {
        "classes": [
            {"name": n, "inputTokens": c[0], "outputTokens": c[1]}
            for n, c in zip(w.names, w.centroids, strict=True)
        ]
    }
    local_up.write_yaml(path, doc)


@dataclass
class Server:
    url: str
    path: Path
    model: Path
    w: Workload
    session: Any
    layout: int = CANDIDATES[0]

    async def get(self, route: str) -> dict[str, Any]:
        async with self.session.get(self.url + route) as r:
            body: dict[str, Any] = await r.json()
            return body

    async def switch(self, layout: int, timeout: float = 240.0) -> float:
        """Rewrite the manifest; seconds until only the new layout is routed, none leaving."""
        before = set((await self.get("/admin/v1/routes"))["replicas"])
        start = time.perf_counter()
        write_manifest(self.path, self.model, layout, self.w)
        self.layout = layout
        while True:
            snap = await self.get("/admin/v1/routes")
            if set(snap["replicas"]) != before and not snap["leaving"]:
                return time.perf_counter() - start
            if time.perf_counter() - start > timeout:
                raise SystemExit(f"tessera bench adaptive: switch timed out: {snap}")
            await asyncio.sleep(0.1)

    async def replay(self, reqs: list[Req], alongside: Any = None) -> float:
        """Send `reqs` on their schedule, `alongside(t0)` running meanwhile; returns t0."""
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(client.send(self.session, self.url, "tiny-llama", r, t0)) for r in reqs
        ]
        if alongside is not None:
            await alongside(t0)
        await asyncio.gather(*tasks)
        return t0
