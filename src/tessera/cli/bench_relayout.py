"""Relayout benchmark: live layout transitions of `tessera up` under trace load.

`tessera bench relayout --json [--requests N] [--time-scale X]` starts `tessera up` (2 local
agents, tiny checkpoint) with 2 whole replicas, replays the shared trace's first N requests
(time-compressed by X, streamed, greedy, `bench serve`'s transforms) and rewrites the manifest
meanwhile: 2 whole → 1 whole + a 0-4|4-8 pipeline → 0-6|6-8 on the other agents → 2 whole. At
each transition `--long-requests` long requests are decoding first, so the KV move path runs.
Keys: `requests_sent`, `requests_completed`, `lost`, `tokens_match` (against `transformers`'
greedy), `transition_s` (manifest written → the gateway routes only new replicas, none leaving,
no block of an unrouted replica held), `p99_ttft_steady_ms` / `p99_ttft_during_ms`,
`extra_bytes_peak` (peak bytes held by all agents' blocks, sampled every 0.1 s, above the larger
steady layout), and the gateway's cut-over counters (drained / moved / recomputed).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import random
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera import blocks
from tessera.bench import client, harness, local_up, options, oracle, trace

ROOT = Path(__file__).resolve().parents[3]
WHOLE = [{"agent": "agent-0", "device": "cpu:0", "layers": [0, 8]}]


def _stage(agent: str, first: int, last: int) -> dict[str, Any]:
    return {"agent": agent, "device": "cpu:0", "layers": [first, last]}


def _whole_and_split(first: str, second: str, cut: int) -> list[dict[str, Any]]:
    """Replica r0 whole on agent-0; r1 in two stages, layers [0, cut) on `first`."""
    stages = [_stage(first, 0, cut), _stage(second, cut, 8)]
    return [{"name": "r0", "stages": WHOLE}, {"name": "r1", "stages": stages}]


LAYOUTS: list[tuple[str, list[dict[str, Any]]]] = [
    (
        "2 whole",
        [{"name": "r0", "stages": WHOLE}, {"name": "r1", "stages": [_stage("agent-1", 0, 8)]}],
    ),
    ("1 whole + 2-stage 0-4|4-8", _whole_and_split("agent-0", "agent-1", 4)),
    ("1 whole + 2-stage 0-6|6-8", _whole_and_split("agent-1", "agent-0", 6)),
]
SEQUENCE = [0, 1, 2, 0]  # layouts in order: start, then three transitions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    trace.add_arguments(parser, requests=120, time_scale=2.0, max_input=256, max_output=64)
    transition_arguments(parser, long_tokens=128, timeout_s=180.0)


def transition_arguments(
    parser: argparse.ArgumentParser, long_tokens: int, timeout_s: float
) -> None:
    """The knobs of a replay with transitions (also `bench switch`'s)."""
    options.add_tls(parser)
    parser.add_argument("--long-tokens", type=int, default=long_tokens)
    parser.add_argument("--long-requests", type=int, default=2)
    parser.add_argument("--drain-deadline", type=float, default=2.0)
    options.add_seed(parser)
    parser.add_argument("--transition-timeout", type=float, default=timeout_s)


def outcome(requests: list[Request], matches: list[bool]) -> dict[str, Any]:
    """What became of a replay's requests: sent, completed, lost, greedy-checked."""
    lost = [r for r in requests if not r.ok]
    return {
        "requests_sent": len(requests),
        "requests_completed": len(requests) - len(lost),
        "lost": len(lost),
        "lost_examples": [r.error or "stream ended early" for r in lost[:5]],
        "tokens_match": bool(matches) and all(matches),
        "tokens_compared": len(matches),
    }


def manifest(model: Path, layout: int) -> dict[str, Any]:
    """The ServingDeployment of `LAYOUTS[layout]` (64 MiB of KV per stage)."""
    return {
        "apiVersion": "serving.tessera.dev/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": "tiny"},
        "spec": {
            "model": {"name": "tiny-llama", "path": str(model), "dtype": "float32"},
            "layout": {
                "mode": "explicit",
                "kvCacheBytes": 64 << 20,
                "replicas": copy.deepcopy(LAYOUTS[layout][1]),
            },
            "gateway": {"port": 8000},
        },
    }


def write_manifest(path: Path, model: Path, layout: int) -> None:
    """Atomically replace the manifest (as an editor's save would)."""
    local_up.write_yaml(path, manifest(model, layout))


Request = client.Stream  # one replayed request and its stream


@dataclass
class Window:
    """One transition: manifest written (`start`) to settled (`end`)."""

    name: str
    start: float
    end: float = 0.0
    cut: float = 0.0  # when the gateway first routed other replicas
    bytes_before: int = 0
    bytes_after: int = 0
    peak: int = 0


@dataclass
class Run:
    requests: list[Request] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    samples: list[tuple[float, int, frozenset[str]]] = field(default_factory=list)
    t0: float = 0.0
    cutover: dict[str, int] = field(default_factory=dict)  # the gateway's counters


async def _held(addresses: list[str], tls: Any) -> tuple[int, frozenset[str]]:
    """Bytes held by every block on the agents, and the replica ids they hold."""
    from tessera.rpc import transport
    from tessera.rpc.v1 import agent_pb2 as pb
    from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

    total, ids = 0, set()
    for address in addresses:
        channel = transport.channel(address, tls)
        try:
            reply = await pb_grpc.AgentStub(channel).Describe(pb.DescribeRequest(), timeout=5)
        finally:
            await channel.close()
        for b in reply.blocks:
            total += b.param_bytes + b.kv_bytes
            ids.add(b.replica_id)
    return total, frozenset(ids)


async def _sampler(addresses: list[str], run: Run, stop: asyncio.Event, tls: Any) -> None:
    while not stop.is_set():
        try:
            total, ids = await _held(addresses, tls)
            run.samples.append((time.perf_counter(), total, ids))
        except Exception:  # an agent busy past the timeout: skip this sample
            pass
        await asyncio.sleep(0.1)


async def _admin(session: Any, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/admin/v1/routes") as r:
        body: dict[str, Any] = await r.json()
        return body


async def transition(
    session: Any,
    url: str,
    run: Run,
    name: str,
    write: Callable[[], None],
    *,
    timeout_s: float,
    settle_s: float | None = 0.3,
    longs: int = 0,
    long_tokens: int = 0,
    rng: random.Random | None = None,
    poll_s: float = 0.1,
    what: str = "relayout",
    names: set[str] | None = None,
) -> Window:
    """Start `longs` long requests, wait until they decode, `write()` the new manifest and
    wait until the gateway routes only new replicas (named `names`, when given: a
    drop-style switch passes through a pipeline of the old replicas), none leaving, and
    the agents hold just those; then, unless `settle_s` is None, wait `settle_s` and
    account the bytes."""
    before = set((await _admin(session, url))["replicas"])
    rng = rng or random.Random(0)
    started = [
        Request([rng.randrange(5, 500) for _ in range(40)], long_tokens) for _ in range(longs)
    ]
    for long in started:
        run.requests.append(long)
        long.at = time.perf_counter() - run.t0
        asyncio.get_running_loop().create_task(client.send(session, url, "tiny-llama", long))
    while any(r.ttft is None and not r.error and not r.done for r in started):
        await asyncio.sleep(0.02)  # the long requests decode when the layout changes
    w = Window(name, time.perf_counter())
    w.bytes_before = run.samples[-1][1] if run.samples else 0
    write()
    while True:
        snap = await _admin(session, url)
        now = set(snap["replicas"])
        if now != before and not w.cut:
            w.cut = time.perf_counter()
        held = run.samples[-1][2] if run.samples and run.samples[-1][0] > w.start else None
        named = names is None or {blocks.parse_replica_id(r).name for r in now} == names
        if now != before and named and not snap["leaving"] and held is not None and held == now:
            break
        if time.perf_counter() > w.start + timeout_s:
            raise SystemExit(f"tessera bench {what}: transition to {w.name} timed out: {snap}")
        await asyncio.sleep(poll_s)
    w.end = time.perf_counter()
    harness.note(
        what, f"to {w.name}: cut-over {w.cut - w.start:.2f} s, done {w.end - w.start:.2f} s"
    )
    if settle_s is not None:
        await asyncio.sleep(settle_s)  # one more sample of the settled layout
        w.bytes_after = run.samples[-1][1]
        w.peak = max(b for t, b, _ in run.samples if w.start <= t <= w.end + settle_s)
    return w


Step = Callable[[Any, Run, int], Awaitable[Window]]  # (session, run, layout) -> its window


async def drive(
    args: argparse.Namespace,
    url: str,
    agents: list[str],
    sequence: list[int],
    step: Step,
    rng: random.Random,
) -> Run:
    """Replay the trace (sampling the agents' blocks), running `step` to each layout of
    `sequence[1:]` at evenly spaced times; then wait for every request and read the
    gateway's cut-over counters."""
    rows = trace.load(args)
    run = Run(trace.streams(rows, rng))  # `rng` draws the prompts, then `step` may draw more
    stop = asyncio.Event()
    async with client.session(900) as session:
        loop = asyncio.get_running_loop()
        sampler = loop.create_task(_sampler(agents, run, stop, args.tls))
        while not run.samples:
            await asyncio.sleep(0.05)
        run.t0 = time.perf_counter()
        replay = [
            loop.create_task(client.send(session, url, "tiny-llama", r, run.t0))
            for r in run.requests
        ]
        span = rows[-1][0]
        for k, layout in enumerate(sequence[1:], start=1):
            await asyncio.sleep(max(0.0, run.t0 + span * k / len(sequence) - time.perf_counter()))
            run.windows.append(await step(session, run, layout))
        await asyncio.gather(*replay)
        while any(not r.done and not r.error for r in run.requests):
            await asyncio.sleep(0.1)  # the long requests
        async with session.get(f"{url}/metrics") as r:
            run.cutover = _cutover_counts(await r.text())
        stop.set()
        await sampler
    return run


def replay(
    args: argparse.Namespace,
    up: local_up.Up,
    sequence: list[int],
    name_of: Callable[[int], str],
    write_of: Callable[[int], None],
    rng: random.Random,
    *,
    with_longs: bool = True,
    names_of: Callable[[int], set[str]] | None = None,
    **kw: Any,
) -> Run:
    """`drive` against a running `up`: each step a `transition` to the layout named
    `name_of(layout)`, written by `write_of(layout)`, with `args`' long requests
    (`with_longs`) and timeout; `kw` goes to `transition` as it is."""

    async def step(session: Any, run: Run, layout: int) -> Window:
        return await transition(
            session,
            up.url,
            run,
            name_of(layout),
            lambda: write_of(layout),
            timeout_s=args.transition_timeout,
            longs=args.long_requests if with_longs and args.long_tokens else 0,
            long_tokens=args.long_tokens,
            rng=rng,
            names=names_of(layout) if names_of else None,
            **kw,
        )

    return asyncio.run(drive(args, up.url, up.agents(), sequence, step, rng))


def _cutover_counts(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("tessera_gateway_cutover_requests_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            out[outcome] = int(float(line.rsplit(" ", 1)[1]))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tessera-relayout-") as tmp:
        model = local_up.make_tiny(Path(tmp) / "tiny-llama")
        path = Path(tmp) / "m.yaml"
        write_manifest(path, model, SEQUENCE[0])
        rng = random.Random(args.seed)
        flags = ["--drain-deadline", str(args.drain_deadline), "--watch-interval", "0.2"]

        with local_up.Up(path, *flags, what="relayout") as up:
            harness.note("relayout", f"serving at {up.url}")
            result = replay(
                args,
                up,
                SEQUENCE,
                lambda k: LAYOUTS[k][0],
                lambda k: write_manifest(path, model, k),
                rng,
            )
        completed = [r for r in result.requests if r.ok]
        harness.note("relayout", f"replay done: {len(completed)}/{len(result.requests)} completed")
        matches = oracle.matches(model, completed)
    windows = result.windows

    def during(r: Request) -> bool:
        return any(w.start <= r.sent <= w.end for w in windows)

    steady = [r.ttft for r in completed if r.ttft is not None and not during(r)]
    busy = [r.ttft for r in completed if r.ttft is not None and during(r)]
    return {
        **outcome(result.requests, matches),
        "tokens_mismatched": matches.count(False),
        "transitions": [w.name for w in windows],
        "transition_s": [round(w.end - w.start, 2) for w in windows],
        "p99_ttft_steady_ms": round(harness.pct(steady, 99) * 1e3, 1),
        "p99_ttft_during_ms": round(harness.pct(busy, 99) * 1e3, 1),
        "requests_during_transitions": len(busy),
        "extra_bytes_peak": max(
            (w.peak - max(w.bytes_before, w.bytes_after) for w in windows), default=0
        ),
        "extra_bytes_per_transition": [
            w.peak - max(w.bytes_before, w.bytes_after) for w in windows
        ],
        "cutover_requests": result.cutover,
        "drain_deadline_s": args.drain_deadline,
        "long_requests_injected": len(windows) * args.long_requests if args.long_tokens else 0,
        "long_tokens": args.long_tokens,
        "time_scale": args.time_scale,
        "trace": str(args.trace),
        "machine": harness.machine(),
        "setup": "tessera up, 2 local agents (cpu:1x2GiB), tiny llama (8 layers), KV 64 MiB "
        "per stage; layouts: " + " -> ".join(LAYOUTS[i][0] for i in SEQUENCE),
    }
