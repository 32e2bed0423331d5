"""Live pipeline bubble of lookahead vs token-count microbatching (part of `bench overload`).

Input: the tiny checkpoint, the replay's prompts and output lengths (a burst's worth,
queued at once: the deep queue a dropped replica sees). It loads one 2-stage pipeline in
this process (layers 0-4 | 4-8, each stage on its own thread: `stage.LocalDownstream`)
behind one `ReplicaEngine` marked dropped, and runs the same requests in rounds,
alternating the leader's microbatch split (ABBA order) between "lookahead" (equal
modelled cost, `tessera.policies.overload.microbatch`) and "token_count" (equal tokens). Each run's
bubble is MEASURED: 1 - sum(stage busy seconds) / (2 x wall seconds), the busy seconds
being each stage's compute time (timestamps around `StageRunner.execute`) over the run's
window. Eq. 1's alpha beta gamma are fitted first to single-prompt prefill times on the
same pipeline. Output: medians per split, per-run values, and whether both splits gave
the same greedy tokens. Called by `tessera.cli.bench_overload.run`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import statistics
import time
from pathlib import Path
from typing import Any

from tessera.cli import local_agents
from tessera.policies.overload import lookahead, microbatch
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

SPLITS = ("lookahead", "token_count")


def measure(
    model: Path,
    prompts: list[list[int]],
    news: list[int],
    rounds: int = 3,
    max_batched_tokens: int = 64,
    min_tokens: int = 8,
) -> dict[str, Any]:
    return asyncio.run(_measure(model, prompts, news, rounds, max_batched_tokens, min_tokens))


async def _measure(
    model: Path,
    prompts: list[list[int]],
    news: list[int],
    rounds: int,
    max_batched_tokens: int,
    min_tokens: int,
) -> dict[str, Any]:
    import torch

    from tessera_agent.engine import replica, sampling, scheduler, stage

    torch.set_num_threads(1)  # two stage threads; no spinning against other work
    stages = [
        stage.load_stage(
            stage.BlockSpec(str(model), a, b, stage_index=i, kv_bytes=32 << 20, page_size=16),
            torch.device("cpu"),
            1 << 30,
        )
        for i, (a, b) in enumerate([(0, 4), (4, 8)])
    ]

    async def connect() -> replica.Downstream:
        return stage.LocalDownstream([s.runner for s in stages[1:]])

    cfg = scheduler.SchedulerConfig(
        max_model_len=stages[0].cfg.max_positions,
        max_batched_tokens=max_batched_tokens,
        prefix_caching=False,  # rounds repeat the prompts: no cache hits between them
    )
    pool = concurrent.futures.ThreadPoolExecutor(1)
    eng = replica.ReplicaEngine(stages[0].runner, pool, cfg, connect)
    eng.dropped = True
    seq = 0

    async def one(prompt: list[int], n: int) -> list[int]:
        nonlocal seq
        seq += 1
        params = sampling.SamplingParams(max_tokens=n, ignore_eos=True)
        return [
            ev.token async for ev in eng.generate(f"b{seq}", prompt, params) if ev.token is not None
        ]

    try:
        eng.split = microbatch.SplitConfig("count")
        samples = []
        for n in (4, 8, 16, 32, 48, 64) * 2:
            t0 = time.perf_counter()
            await one([0] + [7] * (n - 1), 1)
            samples.append(lookahead.ChunkSample(0, n, time.perf_counter() - t0))
        cost = lookahead.fit_chunk_cost(samples)
        runs: dict[str, list[float]] = {s: [] for s in SPLITS}
        tokens: dict[str, list[list[int]]] = {}
        used: dict[str, dict[str, int]] = {}
        for r in range(rounds):
            for split in SPLITS if r % 2 == 0 else SPLITS[::-1]:
                eng.split = microbatch.SplitConfig(split, cost, min_tokens)
                before, counts = eng.busy_s(), dict(eng.splits)
                t0 = time.perf_counter()
                out = list(
                    await asyncio.gather(*(one(p, n) for p, n in zip(prompts, news, strict=True)))
                )
                wall = time.perf_counter() - t0
                busy = [b - a for a, b in zip(before, eng.busy_s(), strict=True)]
                runs[split].append(lookahead.measured_bubble(busy, wall))
                tokens.setdefault(split, out)
                used[split] = {
                    k: v - counts.get(k, 0) for k, v in eng.splits.items() if v - counts.get(k, 0)
                }
    finally:
        await eng.close()
        pool.shutdown()
    return {
        "bubble_fraction_lookahead": round(statistics.median(runs["lookahead"]), 3),
        "bubble_fraction_token_count": round(statistics.median(runs["token_count"]), 3),
        "bubble_runs": {s: [round(v, 3) for v in vs] for s, vs in runs.items()},
        "bubble_microbatches": used,  # microbatches by split in each split's last run
        "bubble_tokens_equal": tokens["lookahead"] == tokens["token_count"],
        "bubble_tokens": tokens["lookahead"],
        "bubble_cost": {"alpha": cost.alpha, "beta": cost.beta, "gamma": cost.gamma},
        "bubble_basis": (
            f"measured: one in-process 2-stage pipeline (layers 0-4 | 4-8), {len(prompts)} "
            f"requests queued at once, {rounds} rounds per split alternating ABBA, "
            f"max_batched_tokens {max_batched_tokens}, min_tokens {min_tokens}; "
            "1 - sum(stage busy s) / (2 x wall s), median over rounds"
        ),
    }


def prefill_cost(agent: local_agents.AgentProcess, replica: str) -> lookahead.ChunkCost:
    """Eq. 1's alpha beta gamma fitted to measured prefill times (max_tokens 1, p = 0)."""
    stub = pb_grpc.AgentStub(transport.sync_channel(agent.address, agent.tls))
    samples = []
    for n in (4, 8, 16, 32, 48, 64) * 2:  # within the small pool
        t0 = time.perf_counter()
        local_agents.generate_tokens(stub, replica, [0] + [7] * (n - 1), 1)
        samples.append(lookahead.ChunkSample(0, n, time.perf_counter() - t0))
    return lookahead.fit_chunk_cost(samples)


def model_bubbles(queue: list[int], cost: lookahead.ChunkCost) -> tuple[float, float, int]:
    """Eq. 1's bubble of lookahead vs token-count splits of `queue` on 2 stages, and the
    lookahead split's microbatch count (NaN, NaN, 0 for a queue under 2 tokens)."""
    chunks = [lookahead.Chunk(f"q{i}", 0, n) for i, n in enumerate(queue)]
    if sum(queue) < 2:
        return float("nan"), float("nan"), 0
    la = lookahead.lookahead_split(chunks, cost, min_tokens=8, max_microbatches=8)
    tc = lookahead.token_count_split(chunks, len(la))
    return lookahead.pipeline_bubble(la, cost, 2), lookahead.pipeline_bubble(tc, cost, 2), len(la)
