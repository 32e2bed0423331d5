"""Relayout on agents whose memory is full: one replica, no room beside it (issue 34).

`bench_relayout`'s replay and checks, on a deployment that make-before-break cannot
switch: one 2-stage replica over both local agents (layers 0-4 | 4-8), each agent's
declared memory (`--capacity-mib`, default 96 MiB) holding its stage's parameters plus a
KV pool of `capacity - 18 MiB` (`kvCacheBytes`; the tiny model's largest stage, [0, 6),
holds 17.4 MiB of parameters), so the new layout (0-6 | 6-8, stages swapped between the
agents) finds no room and no second replica can serve while one is freed: the planner
used to end this `InsufficientMemory`. Now the serving replica's KV pool shrinks
(`ResizeKV`), the new replica loads beside it with a cut pool, the routes cut over, the
old is drained and freed and the new pool grows; then back. Reported as
`bench_relayout.run` reports (lost, tokens_match, transition_s, extra_bytes_peak), plus
`incoming_param_bytes` (the new layouts' parameters: the bound on extra_bytes_peak).
Called by `tests/e2e/test_relayout_full.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import random
import tempfile
from pathlib import Path
from typing import Any

from tessera.bench import local_up, oracle
from tessera.cli import bench_relayout as rl

MiB = 1 << 20
LARGEST_STAGE_MIB = 18  # the tiny model's [0, 6) stage: 17.4 MiB of float32 parameters
LAYOUTS: list[tuple[str, list[dict[str, Any]]]] = [
    (
        "1 replica 0-4|4-8",
        [
            {
                "name": "r0",
                "stages": [
                    {"agent": "agent-0", "device": "cpu:0", "layers": [0, 4]},
                    {"agent": "agent-1", "device": "cpu:0", "layers": [4, 8]},
                ],
            }
        ],
    ),
    (
        "1 replica 0-6|6-8 (stages swapped)",
        [
            {
                "name": "r0",
                "stages": [
                    {"agent": "agent-1", "device": "cpu:0", "layers": [0, 6]},
                    {"agent": "agent-0", "device": "cpu:0", "layers": [6, 8]},
                ],
            }
        ],
    ),
]
SEQUENCE = [0, 1, 0]
PARAM_BYTES = {0: 2 * 11.76 * MiB, 1: (17.39 + 6.13) * MiB}  # per layout (tiny, float32)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    rl.add_arguments(parser)
    parser.add_argument("--capacity-mib", type=int, default=96)


def manifest(model: Path, layout: int, kv_bytes: int) -> dict[str, Any]:
    doc = rl.manifest(model, 0)
    doc["spec"]["layout"]["replicas"] = copy.deepcopy(LAYOUTS[layout][1])
    doc["spec"]["layout"]["kvCacheBytes"] = kv_bytes
    return doc


def write_manifest(path: Path, model: Path, layout: int, kv_bytes: int) -> None:
    local_up.write_yaml(path, manifest(model, layout, kv_bytes))


def run(args: argparse.Namespace) -> dict[str, Any]:
    kv = (args.capacity_mib - LARGEST_STAGE_MIB) * MiB
    with tempfile.TemporaryDirectory(prefix="tessera-relayout-full-") as tmp:
        model = local_up.make_tiny(Path(tmp) / "tiny-llama")
        path = Path(tmp) / "m.yaml"
        write_manifest(path, model, SEQUENCE[0], kv)
        flags = ["--drain-deadline", str(args.drain_deadline), "--watch-interval", "0.2"]
        flags += ["--devices", f"cpu:1x{args.capacity_mib}MiB"]

        async def step(session: Any, run: rl.Run, layout: int) -> rl.Window:
            return await rl.transition(
                session,
                up.url,
                run,
                LAYOUTS[layout][0],
                lambda: write_manifest(path, model, layout, kv),
                timeout_s=args.transition_timeout,
                settle_s=1.0,  # the new pool grows after the old is freed
                what="relayout-full",
            )

        with local_up.Up(path, *flags, what="relayout-full") as up:
            rng = random.Random(args.seed)
            result = asyncio.run(rl.drive(args, up.url, up.agents(), SEQUENCE, step, rng))
        completed = [r for r in result.requests if r.ok]
        matches = oracle.matches(model, completed)
    windows = result.windows
    extra = [w.peak - max(w.bytes_before, w.bytes_after) for w in windows]
    return {
        **rl.outcome(result.requests, matches),
        "transitions": [w.name for w in windows],
        "transition_s": [round(w.end - w.start, 2) for w in windows],
        "bytes_before_after": [(w.bytes_before, w.bytes_after) for w in windows],
        "extra_bytes_peak": max(extra, default=0),
        "extra_bytes_per_transition": extra,
        "incoming_param_bytes": [int(PARAM_BYTES[i]) for i in SEQUENCE[1:]],
        "capacity_bytes_per_agent": args.capacity_mib * MiB,
        "kv_cache_bytes": kv,
        "setup": f"tessera up, 2 local agents (cpu:1x{args.capacity_mib}MiB, full), tiny "
        "llama; one replica: " + " -> ".join(LAYOUTS[i][0] for i in SEQUENCE),
    }
