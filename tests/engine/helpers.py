"""In-process engine driver used by the engine tests (no gRPC)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

import torch

from tessera.policies.overload import microbatch
from tessera_agent.engine import options, replica, sampling, scheduler, stage


def load(
    path: Path,
    splits: list[tuple[int, int]],
    kv_bytes: int = 16 << 20,
    page_size: int = 16,
    engine: options.EngineOptions | None = None,
) -> list[stage.Stage]:
    return [
        stage.load_stage(
            stage.BlockSpec(str(path), a, b, stage_index=i, kv_bytes=kv_bytes, page_size=page_size),
            torch.device("cpu"),
            1 << 30,
            options=engine,
        )
        for i, (a, b) in enumerate(splits)
    ]


async def generate_many(
    stages: list[stage.Stage],
    prompts: list[list[int]],
    params: list[sampling.SamplingParams] | sampling.SamplingParams,
    delays: list[float] | None = None,
    max_batched_tokens: int = 256,
    sink: dict[int, list[scheduler.TokenEvent]] | None = None,
    variants: list[str] | None = None,
    split: microbatch.SplitConfig | None = None,
    dropped: bool = False,
) -> tuple[list[list[int]], replica.ReplicaEngine]:
    """Generate every prompt concurrently; token events land in `sink[i]` when given;
    `variants[i]` names the LoRA adapter of prompt i ("" = the foundation); `split` and
    `dropped` set how a pipelined leader cuts microbatches (as after an overload drop)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    connect = None
    if len(stages) > 1:

        async def connect() -> replica.Downstream:
            return stage.LocalDownstream([s.runner for s in stages[1:]])

    cfg = scheduler.SchedulerConfig(
        max_model_len=stages[0].cfg.max_positions,
        max_batched_tokens=max_batched_tokens,
        eos_token_ids=stages[0].cfg.eos_token_ids,
    )
    eng = replica.ReplicaEngine(stages[0].runner, pool, cfg, connect, split=split)
    eng.dropped = dropped
    plist = params if isinstance(params, list) else [params] * len(prompts)

    async def one(i: int) -> list[int]:
        if delays:
            await asyncio.sleep(delays[i])
        out = []
        variant = variants[i] if variants else ""
        async for ev in eng.generate(f"seq{i}", prompts[i], plist[i], variant):
            if ev.token is not None:
                out.append(ev.token)
                if sink is not None:
                    sink.setdefault(i, []).append(ev)
        return out

    try:
        out = list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))
    finally:
        await eng.close()
        pool.shutdown()
    return out, eng


def run(
    stages: list[stage.Stage],
    prompts: list[list[int]],
    params: list[sampling.SamplingParams] | sampling.SamplingParams,
    **kw: object,
) -> tuple[list[list[int]], replica.ReplicaEngine]:
    return asyncio.run(generate_many(stages, prompts, params, **kw))  # type: ignore[arg-type]
