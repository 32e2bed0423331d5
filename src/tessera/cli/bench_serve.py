"""Serving benchmark: replay the Azure conversation trace against `tessera up` (2 agents).

`tessera bench serve --json [--requests N] [--time-scale X]` makes the default tiny
checkpoint, starts `tessera up` on `examples/local-tiny.yaml`'s layout (2 local agents,
2 replicas: one whole-model, one 2-stage pipeline) and replays the first N requests of
the trace through the OpenAI-compatible gateway with streaming, measuring TTFT and
inter-token latency at the client.

Transforms (reported in the output): the tiny model's context is 1024 tokens, so
prompt tokens are `clip(round(ContextTokens * input_scale), 1, max_input)` random token
ids and `max_tokens` is `clip(round(GeneratedTokens * output_scale), 1, max_output)` with
EOS ignored (every request generates exactly that many tokens); arrival gaps are divided
by `--time-scale`.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
TRACE = ROOT.parent / "shared/traces/azure_llm_2023_conv.csv"
_URL_RE = re.compile(r"at (http://\S+)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="divide the trace's arrival gaps by this"
    )
    parser.add_argument(
        "--trace", type=Path, default=Path(os.environ.get("TESSERA_TRACE", str(TRACE)))
    )
    parser.add_argument("--input-scale", type=float, default=0.1)
    parser.add_argument("--output-scale", type=float, default=0.1)
    parser.add_argument("--max-input", type=int, default=512)
    parser.add_argument("--max-output", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)


def _load(args: argparse.Namespace) -> list[tuple[float, int, int]]:
    rows: list[tuple[float, int, int]] = []
    with args.trace.open() as f:
        for row in csv.DictReader(f):
            ts = datetime.fromisoformat(row["TIMESTAMP"][:26]).timestamp()
            rows.append((ts, int(row["ContextTokens"]), int(row["GeneratedTokens"])))
            if len(rows) >= args.requests:
                break
    if not rows:
        raise SystemExit(f"tessera bench serve: {args.trace} has no requests")
    t0 = rows[0][0]
    return [
        (
            (ts - t0) / args.time_scale,
            min(max(round(ci * args.input_scale), 1), args.max_input),
            min(max(round(co * args.output_scale), 1), args.max_output),
        )
        for ts, ci, co in rows
    ]


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


async def _replay(
    url: str, model: str, reqs: list[tuple[float, int, int]], seed: int
) -> dict[str, Any]:
    import aiohttp

    rng = random.Random(seed)
    prompts = [[rng.randrange(5, 500) for _ in range(n)] for _, n, _ in reqs]
    ttft: list[float] = []
    itl: list[float] = []
    tokens = 0
    failed: list[str] = []
    start = time.perf_counter()

    async def one(i: int, session: aiohttp.ClientSession) -> None:
        nonlocal tokens
        at, _, out = reqs[i]
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - start)))
        body = {
            "model": model,
            "prompt": prompts[i],
            "max_tokens": out,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        sent = time.perf_counter()
        last = None
        got = 0
        try:
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                if resp.status != 200:
                    failed.append(f"{resp.status}: {(await resp.text())[:200]}")
                    return
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        failed.append(str(chunk["error"])[:200])
                        return
                    if chunk.get("usage"):
                        got = chunk["usage"]["completion_tokens"]
                    if chunk.get("choices") and chunk["choices"][0].get("text"):
                        now = time.perf_counter()
                        if last is None:
                            ttft.append(now - sent)
                        else:
                            itl.append(now - last)
                        last = now
        except aiohttp.ClientError as exc:
            failed.append(f"client error: {exc}")
            return
        tokens += got

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(one(i, session) for i in range(len(reqs))))
    wall = time.perf_counter() - start
    return {
        "completed": len(reqs) - len(failed),
        "failed": len(failed),
        "failures": failed[:5],
        "wall_s": round(wall, 2),
        "throughput_tok_s": round(tokens / wall, 1),
        "generated_tokens": tokens,
        "ttft_p50_ms": round(_pct(ttft, 50) * 1e3, 1),
        "ttft_p99_ms": round(_pct(ttft, 99) * 1e3, 1),
        "itl_p50_ms": round(_pct(itl, 50) * 1e3, 1),
        "itl_p99_ms": round(_pct(itl, 99) * 1e3, 1),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    reqs = _load(args)
    exe = [sys.executable, "-m", "tessera.cli.main"]
    with tempfile.TemporaryDirectory(prefix="tessera-serve-") as tmp:
        model = Path(tmp) / "tiny-llama"
        subprocess.run(
            [*exe, "model", "make-tiny", str(model)], check=True, stdout=subprocess.DEVNULL
        )
        manifest = (
            (ROOT / "examples/local-tiny.yaml")
            .read_text()
            .replace("../.demo/tiny-llama", str(model))
        )
        (Path(tmp) / "m.yaml").write_text(manifest)
        up = subprocess.Popen(
            [
                *exe,
                "up",
                "-f",
                str(Path(tmp) / "m.yaml"),
                "--port",
                "0",
                "--state-file",
                str(Path(tmp) / "state.json"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        url = ""
        log: list[str] = []
        assert up.stdout is not None
        try:
            for line in up.stdout:
                log.append(line.rstrip())
                m = _URL_RE.search(line)
                if m and "serving" in line:
                    url = m.group(1)
                    break
            if not url:
                raise SystemExit("tessera bench serve: `tessera up` failed:\n" + "\n".join(log))
            result = asyncio.run(_replay(url, "tiny-llama", reqs, args.seed))
        finally:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(30)
    total_in = sum(n for _, n, _ in reqs)
    return {
        **result,
        "requests": len(reqs),
        "time_scale": args.time_scale,
        "trace": str(args.trace),
        "trace_span_s": round(reqs[-1][0], 2),
        "transforms": {
            "prompt_tokens": f"clip(round(ContextTokens * {args.input_scale}), 1, "
            f"{args.max_input}) random token ids",
            "max_tokens": f"clip(round(GeneratedTokens * {args.output_scale}), 1, "
            f"{args.max_output}), EOS ignored",
            "arrivals": f"trace gaps / {args.time_scale}",
            "mean_prompt_tokens": round(total_in / len(reqs), 1),
            "mean_max_tokens": round(statistics.mean(o for _, _, o in reqs), 1),
        },
        "setup": "tessera up, examples/local-tiny.yaml layout: 2 local agents, replicas r0 "
        "(whole model) and r1 (2 stages)",
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
    }
