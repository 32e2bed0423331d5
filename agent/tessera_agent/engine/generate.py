"""One-shot generation through the engine in this process (CLI `tessera generate`, demos).

Loads the given layer ranges as the stages of one replica, chains them in-process and
returns the generated token ids.
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import torch

from tessera_agent.engine import replica, sampling, scheduler, stage


async def generate_in_process(
    model_path: Path,
    splits: list[tuple[int, int]],
    prompt: list[int],
    params: sampling.SamplingParams,
    kv_bytes: int = 64 << 20,
) -> list[int]:
    stages = [
        stage.load_stage(
            stage.BlockSpec(str(model_path), a, b, stage_index=i, kv_bytes=kv_bytes),
            torch.device("cpu"),
            1 << 40,
        )
        for i, (a, b) in enumerate(splits)
    ]
    pool = concurrent.futures.ThreadPoolExecutor(1)
    connect = None
    if len(stages) > 1:

        async def connect() -> replica.Downstream:
            return stage.LocalDownstream([s.runner for s in stages[1:]])

    cfg = stages[0].cfg
    eng = replica.ReplicaEngine(
        stages[0].runner,
        pool,
        scheduler.SchedulerConfig(max_model_len=cfg.max_positions, eos_token_ids=cfg.eos_token_ids),
        connect,
    )
    try:
        return [
            ev.token async for ev in eng.generate("cli", prompt, params) if ev.token is not None
        ]
    finally:
        await eng.close()
        pool.shutdown()
