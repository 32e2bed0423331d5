"""One batch of prompts through a `ReplicaEngine`, for the engine benchmarks.

`generate` starts a replica engine on a stage's runner, submits every prompt at once
(the engine batches them step by step), collects each request's tokens and closes the
engine. Inputs: the runner, the executor that runs the engine's steps, the longest
sequence, the prompts, sampling parameters and a source of request ids. `add_arguments`
declares the knobs the decode benches share; `tiny` makes the default tiny checkpoint;
`greedy_parts` decodes greedily through a chain of block parts, timing each step. Called
by `bench_engine`, `bench_tp`, `bench_prefill`, `bench_prefix`, `bench_kvmove`,
`bench_stitch` and `bench_speculate`.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from tessera_agent import tiny_checkpoint
from tessera_agent.engine import config, replica, runner, sampling, scheduler

Tokens = list[list[int]]  # token ids, one list per request


def add_arguments(parser: argparse.ArgumentParser, rounds_help: str = "timed rounds") -> None:
    """--quick, --new-tokens, --prompt-len and --rounds (the decode benches' knobs)."""
    parser.add_argument("--quick", action="store_true", help="2 rounds, 16 new tokens")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5, help=rounds_help)


def tiny(folder: str | Path) -> tuple[Path, config.ModelConfig]:
    """The default tiny checkpoint in `folder`/tiny, and its config."""
    path = tiny_checkpoint.make_tiny(Path(folder) / "tiny", tiny_checkpoint.TinySpec())
    return path, config.ModelConfig.from_path(path)


async def generate(
    local: runner.StageRunner,
    pool: concurrent.futures.Executor,
    max_len: int,
    prompts: Sequence[list[int]],
    params: sampling.SamplingParams,
    ids: Iterator[int],
    prefix: str = "r",
) -> Tokens:
    """Every prompt's generated tokens, the prompts served as one batch."""
    eng = replica.ReplicaEngine(local, pool, scheduler.SchedulerConfig(max_model_len=max_len))

    async def one(p: list[int]) -> list[int]:
        return [
            ev.token
            async for ev in eng.generate(f"{prefix}{next(ids)}", p, params)
            if ev.token is not None
        ]

    try:
        return list(await asyncio.gather(*(one(p) for p in prompts)))
    finally:
        await eng.close()


def greedy_parts(
    parts: Sequence[Any], prompt: list[int], new: int, inference: bool = False
) -> tuple[list[int], list[float]]:
    """`new` greedy tokens through `parts` (each reset first, then called in turn on the
    hidden states; the last gives logits), and the seconds of each step."""
    for p in parts:
        p.reset()
    x = torch.tensor([prompt])
    out: list[int] = []
    times: list[float] = []
    for _ in range(new):
        began = time.perf_counter()
        with torch.inference_mode() if inference else contextlib.nullcontext():
            for p in parts:
                x = p(x)
        tok = int(x[0, -1].argmax())
        times.append(time.perf_counter() - began)
        out.append(tok)
        x = torch.tensor([[tok]])
    return out, times
