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
import random
import statistics
import tempfile
from pathlib import Path
from typing import Any

from tessera.bench import client, harness, local_up, trace

ROOT = Path(__file__).resolve().parents[3]
TRACE = trace.TRACE  # the default trace; other benches still name it here
_pct = harness.pct  # for the benches not moved to tessera.bench yet
_load = trace.load


def add_arguments(parser: argparse.ArgumentParser) -> None:
    trace.add_arguments(parser, requests=200, time_scale=1.0)
    parser.add_argument("--seed", type=int, default=0)


async def _replay(
    url: str, model: str, reqs: list[tuple[float, int, int]], seed: int
) -> dict[str, Any]:
    streams = trace.streams(reqs, random.Random(seed))
    t0 = await client.replay(url, model, streams, timeout_s=600)
    wall = max((s.finish for s in streams), default=t0) - t0
    failed = [s.error or "stream ended early" for s in streams if not s.ok]
    ttft = [s.ttft for s in streams if s.ok and s.ttft is not None]
    itl = [gap for s in streams if s.ok for gap in s.itl()]
    tokens = sum(s.usage_tokens or 0 for s in streams if s.ok)
    return {
        "completed": len(reqs) - len(failed),
        "failed": len(failed),
        "failures": failed[:5],
        "wall_s": round(wall, 2),
        "throughput_tok_s": round(tokens / wall, 1),
        "generated_tokens": tokens,
        "ttft_p50_ms": round(harness.pct(ttft, 50) * 1e3, 1),
        "ttft_p99_ms": round(harness.pct(ttft, 99) * 1e3, 1),
        "itl_p50_ms": round(harness.pct(itl, 50) * 1e3, 1),
        "itl_p99_ms": round(harness.pct(itl, 99) * 1e3, 1),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    reqs = trace.load(args)
    with tempfile.TemporaryDirectory(prefix="tessera-serve-") as tmp:
        model = local_up.make_tiny(Path(tmp) / "tiny-llama")
        manifest = (
            (ROOT / "examples/local-tiny.yaml")
            .read_text()
            .replace("../.demo/tiny-llama", str(model))
        )
        (Path(tmp) / "m.yaml").write_text(manifest)
        with local_up.Up(Path(tmp) / "m.yaml", what="serve") as up:
            result = asyncio.run(_replay(up.url, "tiny-llama", reqs, args.seed))
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
        "machine": harness.machine(),
    }
