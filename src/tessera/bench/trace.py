"""The shared conversation trace, scaled for a tiny model: (arrival s, prompt, output) rows.

The Azure LLM inference trace (2023, conversation) lists per request a timestamp, its
context tokens and its generated tokens. A tiny model's context is 1024 tokens, so a
bench scales them: prompt tokens `clip(round(ContextTokens * input_scale), 1, max_input)`,
output tokens `clip(round(GeneratedTokens * output_scale), 1, max_output)` (EOS ignored),
arrival gaps divided by `time_scale`. `add_arguments` declares those knobs with a
bench's defaults; `load` reads the first `requests` rows; `streams` turns rows into
`client.Stream`s with random prompt ids; a `Replay` pairs rows and prompts with the
checkpoint they are served by. `$TESSERA_TRACE` names another trace file: the
`tessera bench` entry point reads it. Called by the serving benchmarks.
"""

from __future__ import annotations

import argparse
import csv
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tessera.bench import client

TRACE = Path(__file__).resolve().parents[3].parent / "shared/traces/azure_llm_2023_conv.csv"

Row = tuple[float, int, int]  # (arrival s after the first, prompt tokens, output tokens)


@dataclass(frozen=True)
class Replay:
    """What a bench replays against a checkpoint: the rows and each row's prompt ids."""

    model: Path
    reqs: list[Row]
    prompts: list[list[int]]


def add_arguments(
    parser: argparse.ArgumentParser,
    *,
    requests: int | None = None,
    time_scale: float | None = None,
    input_scale: float = 0.1,
    output_scale: float = 0.1,
    max_input: int = 512,
    max_output: int = 64,
) -> None:
    """The trace's knobs (`--requests` and `--time-scale` only where a default is given)."""
    if requests is not None:
        parser.add_argument("--requests", type=int, default=requests)
    if time_scale is not None:
        parser.add_argument(
            "--time-scale",
            type=float,
            default=time_scale,
            help="divide the trace's arrival gaps by this",
        )
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--input-scale", type=float, default=input_scale)
    parser.add_argument("--output-scale", type=float, default=output_scale)
    parser.add_argument("--max-input", type=int, default=max_input)
    parser.add_argument("--max-output", type=int, default=max_output)


def load(args: argparse.Namespace) -> list[Row]:
    """The first `args.requests` rows of the trace, scaled (see the module docstring)."""
    rows: list[tuple[float, int, int]] = []
    with args.trace.open() as f:
        for row in csv.DictReader(f):
            ts = datetime.fromisoformat(row["TIMESTAMP"][:26]).timestamp()
            rows.append((ts, int(row["ContextTokens"]), int(row["GeneratedTokens"])))
            if len(rows) >= args.requests:
                break
    if not rows:
        raise SystemExit(f"tessera bench: {args.trace} has no requests")
    t0 = rows[0][0]
    return [
        (
            (ts - t0) / args.time_scale,
            min(max(round(ci * args.input_scale), 1), args.max_input),
            min(max(round(co * args.output_scale), 1), args.max_output),
        )
        for ts, ci, co in rows
    ]


def prompts(rows: list[Row], rng: random.Random) -> list[list[int]]:
    """Random token ids for each row's prompt (ids 5-499: no special token)."""
    return [[rng.randrange(5, 500) for _ in range(n)] for _, n, _ in rows]


def streams(rows: list[Row], rng: random.Random) -> list[client.Stream]:
    """One request per row, on the row's schedule, with random prompt ids."""
    return [
        client.Stream(p, out, at) for p, (at, _, out) in zip(prompts(rows, rng), rows, strict=True)
    ]


def transforms(args: argparse.Namespace) -> str:
    """How the trace was scaled, in one line (reported beside the figures)."""
    return (
        f"prompt clip(round(ContextTokens*{args.input_scale}),1,{args.max_input}) random ids; "
        f"max_tokens clip(round(GeneratedTokens*{args.output_scale}),1,{args.max_output}), "
        f"EOS ignored, greedy"
    )
