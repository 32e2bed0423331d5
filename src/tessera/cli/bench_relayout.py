"""Relayout benchmark: live layout transitions of `tessera up` under trace load.

`tessera bench relayout --json [--requests N] [--time-scale X]` makes the tiny
checkpoint, starts `tessera up` (2 local agents) on a manifest with 2 whole-model
replicas, replays the first N requests of the shared conversation trace (time-compressed
by X, streamed, greedy) and, during the replay, rewrites the manifest: 2 whole replicas →
1 whole + a 2-stage pipeline (layers 0-4 | 4-8) → the pipeline split at other layers and
on the other agents (0-6 | 6-8) → back to 2 whole replicas. `tessera up` watches its
manifest and runs each transition (make-before-break; in-flight requests on leaving
replicas drain or have their KV moved). At each transition `--long-requests` (2) long
greedy requests (`--long-tokens`) are started and decoding before the manifest changes
(least-outstanding routing spreads them over both replicas, so one runs on the replica
that leaves), so the move path runs even when the trace's requests are short; they are
counted with the others.

Reported: `requests_sent`, `requests_completed` (every token arrived, no error), `lost`,
`tokens_match` (every completed greedy text equals `transformers`' greedy decode of the
same prompt, computed after the replay), `transition_s` (per transition: manifest written
→ the gateway routes only the new replicas, none is leaving, and the agents hold no block
of a replica the routes do not name), `p99_ttft_steady_ms` / `p99_ttft_during_ms`
(requests sent outside / inside a transition window), `extra_bytes_peak` (the largest,
over transitions, of the bytes held by all agents' blocks — parameters plus KV pools,
sampled every 0.1 s from `Describe` — above the larger of the two layouts' steady
totals), and the gateway's cut-over counters (drained / moved / recomputed). Prompts and
output lengths follow `bench serve`'s transforms.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.cli import bench_serve

ROOT = Path(__file__).resolve().parents[3]
WHOLE = [{"agent": "agent-0", "device": "cpu:0", "layers": [0, 8]}]
LAYOUTS: list[tuple[str, list[dict[str, Any]]]] = [
    (
        "2 whole",
        [
            {"name": "r0", "stages": WHOLE},
            {"name": "r1", "stages": [{"agent": "agent-1", "device": "cpu:0", "layers": [0, 8]}]},
        ],
    ),
    (
        "1 whole + 2-stage 0-4|4-8",
        [
            {"name": "r0", "stages": WHOLE},
            {
                "name": "r1",
                "stages": [
                    {"agent": "agent-0", "device": "cpu:0", "layers": [0, 4]},
                    {"agent": "agent-1", "device": "cpu:0", "layers": [4, 8]},
                ],
            },
        ],
    ),
    (
        "1 whole + 2-stage 0-6|6-8",
        [
            {"name": "r0", "stages": WHOLE},
            {
                "name": "r1",
                "stages": [
                    {"agent": "agent-1", "device": "cpu:0", "layers": [0, 6]},
                    {"agent": "agent-0", "device": "cpu:0", "layers": [6, 8]},
                ],
            },
        ],
    ),
]
SEQUENCE = [0, 1, 2, 0]  # layouts in order: start, then three transitions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--time-scale", type=float, default=2.0)
    parser.add_argument("--trace", type=Path, default=bench_serve.TRACE)
    parser.add_argument("--input-scale", type=float, default=0.1)
    parser.add_argument("--output-scale", type=float, default=0.1)
    parser.add_argument("--max-input", type=int, default=256)
    parser.add_argument("--max-output", type=int, default=64)
    parser.add_argument("--long-tokens", type=int, default=128)
    parser.add_argument("--long-requests", type=int, default=2)
    parser.add_argument("--drain-deadline", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--transition-timeout", type=float, default=180.0)


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
    import yaml

    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(manifest(model, layout), sort_keys=False))
    os.replace(tmp, path)


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    at: float  # seconds after the replay start
    sent: float = 0.0
    ttft: float | None = None
    text: str = ""
    done: bool = False
    error: str = ""


@dataclass
class Window:
    name: str
    start: float
    end: float = 0.0
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


async def _one(session: Any, url: str, req: Request, run: Run) -> None:
    await asyncio.sleep(max(0.0, run.t0 + req.at - time.perf_counter()))
    body = {
        "model": "tiny-llama",
        "prompt": req.prompt,
        "max_tokens": req.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    req.sent = time.perf_counter()
    parts: list[str] = []
    try:
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            if resp.status != 200:
                req.error = f"{resp.status}: {(await resp.text())[:200]}"
                return
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    req.error = str(chunk["error"])[:200]
                    return
                for ch in chunk.get("choices", []):
                    if ch.get("text"):
                        if req.ttft is None:
                            req.ttft = time.perf_counter() - req.sent
                        parts.append(ch["text"])
                    if ch.get("finish_reason"):
                        req.done = True
    except Exception as exc:  # any client-side failure is a lost request, reported
        req.error = f"client error: {exc!r}"[:200]
    req.text = "".join(parts)


async def _held(addresses: list[str]) -> tuple[int, frozenset[str]]:
    """Bytes held by every block on the agents, and the replica ids they hold."""
    from tessera.rpc import transport
    from tessera.rpc.v1 import agent_pb2 as pb
    from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

    total, ids = 0, set()
    for address in addresses:
        channel = transport.channel(address)
        try:
            reply = await pb_grpc.AgentStub(channel).Describe(pb.DescribeRequest(), timeout=5)
        finally:
            await channel.close()
        for b in reply.blocks:
            total += b.param_bytes + b.kv_bytes
            ids.add(b.replica_id)
    return total, frozenset(ids)


async def _sampler(addresses: list[str], run: Run, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            total, ids = await _held(addresses)
            run.samples.append((time.perf_counter(), total, ids))
        except Exception:  # an agent busy past the timeout: skip this sample
            pass
        await asyncio.sleep(0.1)


async def _admin(session: Any, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/admin/v1/routes") as r:
        body: dict[str, Any] = await r.json()
        return body


async def _transition(
    session: Any,
    url: str,
    path: Path,
    model: Path,
    layout: int,
    run: Run,
    args: argparse.Namespace,
    rng: random.Random,
) -> Window:
    before = set((await _admin(session, url))["replicas"])
    longs = [
        Request([rng.randrange(5, 500) for _ in range(40)], args.long_tokens, 0.0)
        for _ in range(args.long_requests if args.long_tokens else 0)
    ]
    for long in longs:
        run.requests.append(long)
        long.at = time.perf_counter() - run.t0
        asyncio.get_running_loop().create_task(_one(session, url, long, run))
    while any(r.ttft is None and not r.error for r in longs):
        await asyncio.sleep(0.02)  # the long requests decode when the layout changes
    w = Window(LAYOUTS[layout][0], time.perf_counter())
    w.bytes_before = run.samples[-1][1] if run.samples else 0
    write_manifest(path, model, layout)
    deadline = w.start + args.transition_timeout
    while True:
        snap = await _admin(session, url)
        now = set(snap["replicas"])
        held = run.samples[-1][2] if run.samples and run.samples[-1][0] > w.start else None
        if now != before and not snap["leaving"] and held is not None and held == now:
            break
        if time.perf_counter() > deadline:
            raise SystemExit(f"tessera bench relayout: transition to {w.name} timed out: {snap}")
        await asyncio.sleep(0.1)
    w.end = time.perf_counter()
    _note(f"transition to {w.name}: {w.end - w.start:.2f} s")
    await asyncio.sleep(0.3)  # one more sample of the settled layout
    w.bytes_after = run.samples[-1][1]
    w.peak = max(b for t, b, _ in run.samples if w.start <= t <= w.end + 0.3)
    return w


async def _drive(
    args: argparse.Namespace, url: str, agents: list[str], path: Path, model: Path
) -> Run:
    import aiohttp

    rows = bench_serve._load(args)
    rng = random.Random(args.seed)
    run = Run([Request([rng.randrange(5, 500) for _ in range(n)], out, at) for at, n, out in rows])
    stop = asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        sampler = asyncio.get_running_loop().create_task(_sampler(agents, run, stop))
        while not run.samples:
            await asyncio.sleep(0.05)
        run.t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        replay = [loop.create_task(_one(session, url, r, run)) for r in run.requests]
        span = rows[-1][0]
        for k, layout in enumerate(SEQUENCE[1:], start=1):
            await asyncio.sleep(max(0.0, run.t0 + span * k / len(SEQUENCE) - time.perf_counter()))
            w = await _transition(session, url, path, model, layout, run, args, rng)
            run.windows.append(w)
        await asyncio.gather(*replay)
        while any(not r.done and not r.error for r in run.requests):
            await asyncio.sleep(0.1)  # the long requests
        async with session.get(f"{url}/metrics") as r:
            metrics_text = await r.text()
        stop.set()
        await sampler
    run.cutover = _cutover_counts(metrics_text)
    return run


def _note(msg: str) -> None:
    sys.stderr.write(f"[relayout {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def _cutover_counts(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("tessera_gateway_cutover_requests_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            out[outcome] = int(float(line.rsplit(" ", 1)[1]))
    return out


def _wait_for_url(up: subprocess.Popen[str], log: list[str]) -> str:
    assert up.stdout is not None
    for line in up.stdout:
        log.append(line.rstrip())
        m = bench_serve._URL_RE.search(line)
        if m and "serving" in line:
            # keep draining its output (into `log`), so `up` never blocks on a full pipe
            def drain() -> None:
                for rest in up.stdout or ():
                    log.append(rest.rstrip())

            threading.Thread(target=drain, daemon=True).start()
            return m.group(1)
    raise SystemExit("tessera bench relayout: `tessera up` failed:\n" + "\n".join(log))


def _reference(model: Path, reqs: list[Request]) -> list[bool]:
    """Whether each completed request's text is transformers' greedy decode."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)  # one thread: no spinning against the agents on a busy host
    hf: Any = AutoModelForCausalLM.from_pretrained(str(model))
    hf.generation_config.eos_token_id = None
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    out = []
    for r in reqs:
        ids = torch.tensor([r.prompt])
        with torch.no_grad():
            seq = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=r.max_tokens,
                pad_token_id=0,
            )
        want = tok.decode(seq[0, len(r.prompt) :].tolist(), skip_special_tokens=True)
        out.append(want == r.text)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    exe = [sys.executable, "-m", "tessera.cli.main"]
    with tempfile.TemporaryDirectory(prefix="tessera-relayout-") as tmp:
        model = Path(tmp) / "tiny-llama"
        subprocess.run(
            [*exe, "model", "make-tiny", str(model)], check=True, stdout=subprocess.DEVNULL
        )
        path = Path(tmp) / "m.yaml"
        write_manifest(path, model, SEQUENCE[0])
        state = Path(tmp) / "state.json"
        up = subprocess.Popen(
            [
                *exe,
                "up",
                "-f",
                str(path),
                "--port",
                "0",
                "--state-file",
                str(state),
                "--drain-deadline",
                str(args.drain_deadline),
                "--watch-interval",
                "0.2",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        log: list[str] = []
        try:
            url = _wait_for_url(up, log)
            _note(f"serving at {url}")
            agents = [a["address"] for a in json.loads(state.read_text())["agents"]]
            result = asyncio.run(_drive(args, url, agents, path, model))
        finally:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(30)
        completed = [r for r in result.requests if r.done and not r.error]
        _note(f"replay done: {len(completed)}/{len(result.requests)} completed; comparing")
        matches = _reference(model, completed)
        _note("compared with transformers")
    windows = result.windows

    def during(r: Request) -> bool:
        return any(w.start <= r.sent <= w.end for w in windows)

    steady = [r.ttft for r in completed if r.ttft is not None and not during(r)]
    busy = [r.ttft for r in completed if r.ttft is not None and during(r)]
    lost = [r for r in result.requests if not (r.done and not r.error)]
    return {
        "requests_sent": len(result.requests),
        "requests_completed": len(completed),
        "lost": len(lost),
        "lost_examples": [r.error or "stream ended early" for r in lost[:5]],
        "tokens_match": bool(matches) and all(matches),
        "tokens_compared": len(matches),
        "tokens_mismatched": matches.count(False),
        "transitions": [w.name for w in windows],
        "transition_s": [round(w.end - w.start, 2) for w in windows],
        "p99_ttft_steady_ms": round(bench_serve._pct(steady, 99) * 1e3, 1),
        "p99_ttft_during_ms": round(bench_serve._pct(busy, 99) * 1e3, 1),
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
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "setup": "tessera up, 2 local agents (cpu:1x2GiB), tiny llama (8 layers), KV 64 MiB "
        "per stage; layouts: " + " -> ".join(LAYOUTS[i][0] for i in SEQUENCE),
    }
