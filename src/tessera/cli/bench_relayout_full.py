"""Relayout on agents whose memory is full: one replica, no room beside it.

`bench_relayout`'s replay and checks on deployments make-before-break cannot switch. Default:
one 0-4 | 4-8 replica over both local agents, each agent's memory (`--capacity-mib`, 96 MiB)
holding its stage's parameters plus a pool of `capacity - 18 MiB`, switched to 0-6 | 6-8 with
stages swapped: the serving pool shrinks (`ResizeKV`), the new replica loads beside it, the
routes cut over, the old is freed and the new pool grows; then back. `--scenario drop`: two
whole replicas (34 MiB per agent: 23.5 MiB parameters, 10 MiB pool) switched to one 0-4 | 4-8
replica, which needs a drop-style transition (the two whole replicas drop into one pipeline
first). Reported as `bench_relayout.run` reports (lost, tokens_match, transition_s,
extra_bytes_peak), plus `incoming_param_bytes` (the bound on extra_bytes_peak). Called by
`tests/e2e/test_relayout_full.py`.
"""

from __future__ import annotations

import argparse
import copy
import random
import re
import tempfile
from dataclasses import dataclass
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
WHOLE_MIB = 24  # the tiny model's whole replica: 23.5 MiB of float32 parameters


def _whole(name: str, agent: str) -> dict[str, Any]:
    return {"name": name, "stages": [{"agent": agent, "device": "cpu:0", "layers": [0, 8]}]}


DROP_LAYOUTS: list[tuple[str, list[dict[str, Any]]]] = [
    ("2 whole replicas", [_whole("w0", "agent-0"), _whole("w1", "agent-1")]),
    (
        "1 replica 0-4|4-8 (stage 0 on agent-1)",
        [
            {
                "name": "p",
                "stages": [
                    {"agent": "agent-1", "device": "cpu:0", "layers": [0, 4]},
                    {"agent": "agent-0", "device": "cpu:0", "layers": [4, 8]},
                ],
            }
        ],
    ),
]


@dataclass(frozen=True)
class Scenario:
    layouts: list[tuple[str, list[dict[str, Any]]]]
    sequence: list[int]
    param_bytes: dict[int, float]  # the incoming parameters of each layout
    reserved_mib: int  # of each agent's memory, what the largest block's parameters take
    capacity_mib: int  # default memory per agent


SCENARIOS = {
    "full": Scenario(LAYOUTS, SEQUENCE, PARAM_BYTES, LARGEST_STAGE_MIB, 96),
    "drop": Scenario(DROP_LAYOUTS, [0, 1], {0: 2 * 23.52 * MiB, 1: 2 * 11.76 * MiB}, WHOLE_MIB, 34),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    rl.add_arguments(parser)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="full")
    parser.add_argument("--capacity-mib", type=int, default=0, help="0: the scenario's")


def manifest(
    model: Path, layout: int, kv_bytes: int, sc: Scenario = SCENARIOS["full"]
) -> dict[str, Any]:
    doc = rl.manifest(model, 0)
    doc["spec"]["layout"]["replicas"] = copy.deepcopy(sc.layouts[layout][1])
    doc["spec"]["layout"]["kvCacheBytes"] = kv_bytes
    return doc


def write_manifest(
    path: Path, model: Path, layout: int, kv_bytes: int, sc: Scenario = SCENARIOS["full"]
) -> None:
    local_up.write_yaml(path, manifest(model, layout, kv_bytes, sc))


MODE_RE = re.compile(r"Switching: generation \d+ \(([a-z-]+)\)")


def _modes(log: list[str]) -> list[str]:
    """The transition modes `tessera up` reported, in the order first seen."""
    seen: list[str] = []
    for line in log:
        for m in MODE_RE.finditer(line):
            if m.group(1) not in seen:
                seen.append(m.group(1))
    return seen


def run(args: argparse.Namespace) -> dict[str, Any]:
    sc = SCENARIOS[args.scenario]
    capacity_mib = args.capacity_mib or sc.capacity_mib
    kv = (capacity_mib - sc.reserved_mib) * MiB
    with tempfile.TemporaryDirectory(prefix="tessera-relayout-full-") as tmp:
        model = local_up.make_tiny(Path(tmp) / "tiny-llama")
        path = Path(tmp) / "m.yaml"
        write_manifest(path, model, sc.sequence[0], kv, sc)
        flags = ["--drain-deadline", str(args.drain_deadline), "--watch-interval", "0.2"]
        flags += ["--devices", f"cpu:1x{capacity_mib}MiB"]

        with local_up.Up(path, *flags, what="relayout-full") as up:
            result = rl.replay(
                args,
                up,
                sc.sequence,
                lambda k: sc.layouts[k][0],
                lambda k: write_manifest(path, model, k, kv, sc),
                random.Random(args.seed),
                with_longs=False,
                names_of=lambda k: {r["name"] for r in sc.layouts[k][1]},
                settle_s=1.0,  # the new pool grows after the old is freed
                what="relayout-full",
            )
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
        "incoming_param_bytes": [int(sc.param_bytes[i]) for i in sc.sequence[1:]],
        "capacity_bytes_per_agent": capacity_mib * MiB,
        "kv_cache_bytes": kv,
        "transition_modes": _modes(up.log),
        "setup": f"tessera up, 2 local agents (cpu:1x{capacity_mib}MiB, full), tiny "
        "llama: " + " -> ".join(sc.layouts[i][0] for i in sc.sequence),
    }
