"""Abuse benchmark: the gateway under hostile clients keeps serving everyone else.

`tessera bench abuse --json [--phase-s S]` runs a gateway in its own process (its RSS is its
own) in front of a simulated replica (a scripted leader streaming a token every `--token-ms`:
the gateway's handling is measured, no model runs). A clean phase, then one phase per attack,
each `--phase-s` seconds of /health probes every 50 ms, normal streamed completions (`--rate`
per second) and the attack: `stop_flood` (10,000 stop strings), `max_body` (just under and over
2 MiB), `slow_bodies` (200 stalled half bodies), `never_read` (32 unread streams), `deep_json`
(nesting 100,000 deep), at `--attack-rate`. A flood at any rate measures CPU, not hardening:
bound it in front of the gateway. Per phase: /health p99, normal p99 TTFT and its ratio to the
clean phase, RSS growth, 5xx count, attack answers by status. Targets: /health p99 <= 100 ms,
TTFT ratio <= 2, RSS growth <= 100 MB, no 5xx (docs/gateway.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import platform
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

ATTACKS = ("stop_flood", "max_body", "slow_bodies", "never_read", "deep_json")
MODEL = "tiny"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--phase-s", type=float, default=15.0, help="seconds per phase")
    parser.add_argument("--rate", type=float, default=8.0, help="normal requests per second")
    parser.add_argument("--token-ms", type=float, default=5.0, help="simulated token gap")
    parser.add_argument(
        "--attack-rate", type=float, default=50.0, help="hostile requests per second (floods)"
    )
    parser.add_argument(
        "--attacks", default=",".join(ATTACKS), help=f"comma-separated, of {ATTACKS}"
    )


# -- the simulated replica and the gateway, each in its own process ----------------------


def _leader_main(token_s: float, out: Any) -> None:
    import grpc

    from tessera.rpc import transport
    from tessera.rpc.v1 import agent_pb2 as pb
    from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

    class Leader(pb_grpc.AgentServicer):  # type: ignore[misc]
        async def Describe(self, request: Any, context: Any) -> pb.DescribeReply:
            return pb.DescribeReply(agent_id="sim", kv=[pb.ReplicaKV(replica_id="r0")])

        async def Generate(self, request: Any, context: Any) -> Any:
            n = request.params.max_tokens
            for i in range(n):
                await asyncio.sleep(token_s)
                yield pb.GenerateChunk(
                    token_ids=[300], finish_reason="length" if i == n - 1 else ""
                )

    async def serve() -> None:
        srv: grpc.aio.Server = transport.server()
        pb_grpc.add_AgentServicer_to_server(Leader(), srv)
        port = transport.add_port(srv, "127.0.0.1:0", tls=None)
        await srv.start()
        out.put(f"127.0.0.1:{port}")
        await srv.wait_for_termination()

    asyncio.run(serve())


def _gateway_main(model: str, leader: str, out: Any) -> None:
    from tessera.gateway import config, server

    async def serve() -> None:
        cfg = config.GatewayConfig(
            MODEL,
            model,
            port=0,
            replicas=(config.ReplicaEndpoint("r0", leader),),
            generate_mux=False,  # the simulated leader answers per-request Generate calls
        )
        gw = await server.start_gateway(cfg)
        out.put(gw.url)
        await asyncio.Event().wait()

    asyncio.run(serve())


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


# -- clients -------------------------------------------------------------------------------


def _p99(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.99 * len(s)))]


class Phase:
    """What one phase measured."""

    def __init__(self) -> None:
        self.health_ms: list[float] = []
        self.ttft_ms: list[float] = []
        self.statuses: Counter[str] = Counter()  # "normal:200", "attack:400", ...
        self.rss_start = 0.0
        self.rss_peak = 0.0

    def fives(self) -> int:
        codes = ((k.split(":")[1], n) for k, n in self.statuses.items())
        return sum(n for code, n in codes if code.isdigit() and int(code) >= 500)


async def _raw_request(
    host: str, port: int, body: bytes, send: int | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(host, port)
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    writer.write(head + (body if send is None else body[:send]))
    await writer.drain()
    return reader, writer


async def _status_of(reader: asyncio.StreamReader) -> str:
    line = await reader.readline()
    parts = line.split()
    return parts[1].decode() if len(parts) > 1 else "closed"


async def _post(session: Any, url: str, raw: bytes) -> str:
    import aiohttp

    try:
        headers = {"Content-Type": "application/json"}
        async with session.post(url + "/v1/completions", data=raw, headers=headers) as r:
            await r.read()
            return str(r.status)
    except aiohttp.ClientError:
        return "closed"


def _attack(
    name: str, url: str, rate: float, phase: Phase, stop: asyncio.Event
) -> Callable[[], Coroutine[Any, Any, None]]:
    import aiohttp

    host, port_s = url.removeprefix("http://").rsplit(":", 1)
    port = int(port_s)
    base = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4}

    async def loops(make: Callable[[int], bytes]) -> None:
        """`rate` hostile requests a second, at most 64 unanswered."""
        async with aiohttp.ClientSession() as s:
            room = asyncio.Semaphore(64)
            tasks: set[asyncio.Task[None]] = set()

            async def one(i: int) -> None:
                try:
                    phase.statuses[f"attack:{await _post(s, url, make(i))}"] += 1
                finally:
                    room.release()

            i = 0
            while not stop.is_set():
                await room.acquire()
                task = asyncio.create_task(one(i))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                i += 1
                await asyncio.sleep(1 / rate)
            await asyncio.gather(*tasks, return_exceptions=True)

    async def stop_flood() -> None:
        body = json.dumps({**base, "stop": [f"s{i}" for i in range(10_000)]}).encode()
        await loops(lambda i: body)

    async def max_body() -> None:
        under = json.dumps({**base, "prompt": "a" * ((2 << 20) - 200)}).encode()
        over = json.dumps({**base, "prompt": "a" * (2 << 20)}).encode()
        await loops(lambda i: under if i % 2 else over)

    async def deep_json() -> None:
        deep = json.dumps(base)[:-1].encode() + b', "user": ' + b"[" * 100_000
        deep += b"]" * 100_000 + b"}"
        await loops(lambda i: deep)

    async def hold(conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
        try:
            await stop.wait()
        finally:
            for _, w in conns:
                w.close()

    async def slow_bodies() -> None:
        body = json.dumps(base).encode()
        conns = [await _raw_request(host, port, body, send=len(body) // 2) for _ in range(200)]
        await hold(conns)
        phase.statuses["attack:stalled"] += len(conns)

    async def never_read() -> None:
        body = json.dumps({**base, "max_tokens": 1000, "stream": True}).encode()
        conns = []
        for _ in range(32):
            r, w = await _raw_request(host, port, body)
            sock = w.get_extra_info("socket")
            if sock is not None:
                import socket

                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            conns.append((r, w))
        await hold(conns)
        phase.statuses["attack:never-read"] += len(conns)

    return {
        "stop_flood": stop_flood,
        "max_body": max_body,
        "slow_bodies": slow_bodies,
        "never_read": never_read,
        "deep_json": deep_json,
    }[name]


async def _probe_health(url: str, phase: Phase, stop: asyncio.Event) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        while not stop.is_set():
            t = time.perf_counter()
            try:
                async with s.get(url + "/health") as r:
                    await r.read()
                    phase.statuses[f"health:{r.status}"] += 1
            except aiohttp.ClientError:
                phase.statuses["health:599"] += 1
            phase.health_ms.append((time.perf_counter() - t) * 1000)
            await asyncio.sleep(0.05)


async def _normal(url: str, rate: float, phase: Phase, stop: asyncio.Event) -> None:
    import aiohttp

    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 16, "stream": True}

    async def one(s: aiohttp.ClientSession) -> None:
        t = time.perf_counter()
        try:
            async with s.post(url + "/v1/completions", json=body) as r:
                phase.statuses[f"normal:{r.status}"] += 1
                first = True
                async for _ in r.content.iter_any():
                    if first:
                        phase.ttft_ms.append((time.perf_counter() - t) * 1000)
                        first = False
        except aiohttp.ClientError:
            phase.statuses["normal:599"] += 1

    async with aiohttp.ClientSession() as s:
        tasks = set()
        while not stop.is_set():
            task = asyncio.create_task(one(s))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(1 / rate)
        await asyncio.gather(*tasks, return_exceptions=True)


async def _rss(pid: int, phase: Phase, stop: asyncio.Event) -> None:
    phase.rss_start = phase.rss_peak = _rss_mb(pid)
    while not stop.is_set():
        phase.rss_peak = max(phase.rss_peak, _rss_mb(pid))
        await asyncio.sleep(0.2)


async def _phase(url: str, pid: int, attack: str | None, args: argparse.Namespace) -> Phase:
    phase, stop = Phase(), asyncio.Event()
    work = [
        _probe_health(url, phase, stop),
        _normal(url, args.rate, phase, stop),
        _rss(pid, phase, stop),
    ]
    if attack is not None:
        work.append(_attack(attack, url, args.attack_rate, phase, stop)())
    tasks = [asyncio.create_task(w) for w in work]
    await asyncio.sleep(args.phase_s)
    stop.set()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(30):
            await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:
        t.cancel()
    return phase


async def _bench(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    attacks = [a for a in args.attacks.split(",") if a]
    unknown = set(attacks) - set(ATTACKS)
    if unknown:
        raise SystemExit(f"unknown attacks: {sorted(unknown)}")
    clean = await _phase(url, pid, None, args)
    clean_p99 = _p99(clean.ttft_ms)
    phases: dict[str, Any] = {"clean": _report(clean, clean_p99)}
    for a in attacks:
        await asyncio.sleep(1.0)  # let the previous attack's connections close
        phases[a] = _report(await _phase(url, pid, a, args), clean_p99)
    verdict = all(p["ok"] for p in phases.values())
    return {"phases": phases, "all_targets_met": verdict}


def _report(p: Phase, clean_p99: float | None) -> dict[str, Any]:
    health, ttft = _p99(p.health_ms), _p99(p.ttft_ms)
    ratio = ttft / clean_p99 if ttft is not None and clean_p99 else None
    growth = p.rss_peak - p.rss_start
    ok = (
        health is not None
        and health <= 100
        and (ratio is None or ratio <= 2)
        and growth <= 100
        and p.fives() == 0
    )
    return {
        "health_p99_ms": None if health is None else round(health, 1),
        "health_probes": len(p.health_ms),
        "ttft_p99_ms": None if ttft is None else round(ttft, 1),
        "ttft_p99_ratio_vs_clean": None if ratio is None else round(ratio, 2),
        "normal_requests": len(p.ttft_ms),
        "rss_start_mb": round(p.rss_start, 1),
        "rss_growth_mb": round(growth, 1),
        "count_5xx": p.fives(),
        "statuses": dict(sorted(p.statuses.items())),
        "ok": ok,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tessera_agent import tiny_checkpoint

    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="tessera-bench-abuse-") as tmp:
        model = tiny_checkpoint.make_tiny(Path(tmp) / "tiny", tiny_checkpoint.TinySpec())
        q: Any = ctx.Queue()
        leader = ctx.Process(target=_leader_main, args=(args.token_ms / 1000, q), daemon=True)
        leader.start()
        address = q.get(timeout=60)
        gateway = ctx.Process(target=_gateway_main, args=(str(model), address, q), daemon=True)
        gateway.start()
        try:
            url = q.get(timeout=60)
            assert gateway.pid is not None
            result = asyncio.run(_bench(url, gateway.pid, args))
        finally:
            for p in (gateway, leader):
                p.terminate()
                p.join(5)
    return {
        "bench": "abuse",
        "replica": f"simulated (a scripted leader, one token every {args.token_ms:g} ms)",
        "phase_s": args.phase_s,
        "normal_rate_per_s": args.rate,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared; not a quiet machine)",
        **result,
    }
