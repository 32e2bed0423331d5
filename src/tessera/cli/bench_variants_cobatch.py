"""Per-block batching in process: chains sharing blocks, saturated, co-batching on vs off.

Part of `tessera bench variants --json` (its `cobatch_in_process` key). A foundation and
`chains - 1` full fine-tunes (each changing 2 layers) are loaded on one block zoo; every
chain gets `seqs` requests at once (greedy, `new` tokens, EOS ignored), all engines on one
compute executor: the co-batching one (`engine/cobatch.py`) or the plain
`ThreadPoolExecutor(1)`; one torch thread, as the bench's agents. Rounds alternate the
order (on/off, off/on) and the ratio is taken per round, so a machine's varying load
cancels within a round. No gRPC: this is the
engine's effect alone (the agent-process A/B in `bench_variants` adds the event loop's
work). Also times one step's hand-off on the common path (one engine, an empty step)
through both executors. Called by `bench_variants.run`.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from tessera import model_facts


def run(root: Path, base: Path, chains: int, seqs: int, new: int, rounds: int) -> dict[str, Any]:
    import concurrent.futures

    import torch

    from tessera_agent import tiny_variants
    from tessera_agent.engine import block_zoo, cobatch, replica, sampling, scheduler, stage, step

    torch.set_num_threads(1)  # as the bench's agents run
    layers = model_facts.num_layers(base)
    paths = [base] + [
        tiny_variants.make_tiny_finetune(
            base, root / f"co-ft{i}", layers=[i % layers, (i + 3) % layers], seed=100 + i
        )
        for i in range(1, chains)
    ]
    zoo = block_zoo.BlockZoo()
    stages = [
        stage.load_stage(
            stage.BlockSpec(str(p), 0, layers, kv_bytes=8 << 20, page_size=16),
            torch.device("cpu"),
            1 << 31,
            zoo=zoo,
        )
        for p in paths
    ]
    cfg = scheduler.SchedulerConfig(max_model_len=stages[0].cfg.max_positions)
    params = sampling.SamplingParams(max_tokens=new, ignore_eos=True)
    tokens: dict[str, list[list[int]]] = {}

    async def serve(ex: concurrent.futures.Executor, tag: str) -> float:
        engs = [replica.ReplicaEngine(s.runner, ex, cfg) for s in stages]

        async def one(e: int, i: int) -> list[int]:
            prompt = [0, *range(5 + e, 5 + e + 8 + i)]
            out = []
            async for ev in engs[e].generate(f"{tag}-{e}-{i}", prompt, params):
                if ev.token is not None:
                    out.append(ev.token)
            return out

        t0 = time.perf_counter()
        got = await asyncio.gather(*(one(e, i) for e in range(chains) for i in range(seqs)))
        dt = time.perf_counter() - t0
        for eng in engs:
            await eng.close()
        tokens[tag] = list(got)
        return chains * seqs * new / dt

    async def handoff(ex: concurrent.futures.Executor, n: int = 2000) -> float:
        inp = step.StepInput(step_id=0, chunks=[])
        t0 = time.perf_counter()
        for _ in range(n):
            await cobatch.run_step(ex, stages[0].runner, inp)
        return (time.perf_counter() - t0) / n

    on: list[float] = []
    off: list[float] = []
    hand_on: list[float] = []
    hand_off: list[float] = []
    costeps = cobatched = 0
    for r in range(rounds):
        for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
            # the hand-off on a fresh executor: one engine, no partner ever seen
            if mode == "on":
                co = cobatch.CoBatchExecutor()
                on.append(asyncio.run(serve(co, "on")))
                costeps += co.stats.costeps
                cobatched += co.stats.cobatched_steps
                co.shutdown()
                co = cobatch.CoBatchExecutor()
                hand_on.append(asyncio.run(handoff(co)))
                co.shutdown()
            else:
                for timed in (False, True):
                    plain = concurrent.futures.ThreadPoolExecutor(1)
                    if timed:
                        hand_off.append(asyncio.run(handoff(plain)))
                    else:
                        off.append(asyncio.run(serve(plain, "off")))
                    plain.shutdown()
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    return {
        "chains": chains,
        "requests_per_chain": seqs,
        "new_tokens": new,
        "rounds": rounds,
        "throughput_on_tok_s": [round(x, 1) for x in on],
        "throughput_off_tok_s": [round(x, 1) for x in off],
        "throughput_ratio_per_round": [round(x, 3) for x in ratios],
        "throughput_ratio_median": round(statistics.median(ratios), 3),
        "costeps": costeps,
        "cobatched_steps": cobatched,
        "handoff_us_cobatch": round(1e6 * statistics.median(hand_on), 1),
        "handoff_us_plain": round(1e6 * statistics.median(hand_off), 1),
        "tokens_match": tokens["on"] == tokens["off"],
    }
