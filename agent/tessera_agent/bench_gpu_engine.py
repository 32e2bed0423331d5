"""The block engine driven in this process for `tessera bench gpu`: load, capture, time tokens.

`Engine` loads one whole-model stage on a device (CUDA graphs captured at load, or the
graph logic replayed eagerly on CPU) and runs batches of greedy requests through a
`ReplicaEngine` on one compute thread, timing every token; `prompts` makes seeded random
prompts. Used by `bench_gpu_shape` and `scripts/gpu_profile.py`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import time
from pathlib import Path
from typing import Any

import torch

from tessera_agent.engine import config, cuda_graphs, replica, sampling, scheduler, stage

Tokens = list[list[int]]


class Engine:
    """One whole-model stage on `device`, driven in this process like an agent's leader
    (one compute thread, `ReplicaEngine`), timing every token."""

    def __init__(
        self, path: Path, device: torch.device, dtype: str, kv_bytes: int, fake_graphs: bool = False
    ) -> None:
        budget = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 1 << 40
        layers = config.ModelConfig.from_path(path).num_layers
        self.spec = stage.BlockSpec(
            str(path), 0, layers, device=str(device), dtype=dtype, kv_bytes=kv_bytes
        )
        self.stage = stage.load_stage(self.spec, device, budget)
        self.pool = concurrent.futures.ThreadPoolExecutor(1)
        self.counter = 0
        r = self.stage.runner
        if device.type == "cpu" and fake_graphs:  # the graph logic, replayed eagerly
            r.graphs = cuda_graphs.DecodeGraphs(
                r.model, device, 256, 1024, r.page_size, api=cuda_graphs.FakeGraphs()
            )
        # CUDA graphs captured at load, on the thread that runs the steps.
        self.capture_s = self.pool.submit(self.stage.runner.capture_graphs).result()

    def generate(
        self, prompts: Tokens, new: int, logprobs: int | None = None
    ) -> tuple[Tokens, list[list[float]], list[list[sampling.TokenLogprobs]], float]:
        """Greedy tokens, each token's arrival time (s after the start), log-probabilities
        when asked, and the wall time of the whole batch."""
        params = sampling.SamplingParams(max_tokens=new, ignore_eos=True, logprobs=logprobs)
        cfg = scheduler.SchedulerConfig(max_model_len=self.stage.cfg.max_positions)

        async def main() -> tuple[list[tuple[list[int], list[float], list[Any]]], float]:
            eng = replica.ReplicaEngine(self.stage.runner, self.pool, cfg)
            t0 = time.perf_counter()

            async def one(p: list[int]) -> tuple[list[int], list[float], list[Any]]:
                self.counter += 1
                toks: list[int] = []
                times: list[float] = []
                lps: list[Any] = []
                async for ev in eng.generate(f"g{self.counter}", p, params):
                    if ev.error:
                        raise RuntimeError(ev.error)
                    if ev.token is not None:
                        toks.append(ev.token)
                        times.append(time.perf_counter() - t0)
                        lps.append(ev.logprobs)
                return toks, times, lps

            try:
                got = list(await asyncio.gather(*(one(p) for p in prompts)))
                return got, time.perf_counter() - t0
            finally:
                await eng.close()

        got, wall = asyncio.run(main())
        return [g[0] for g in got], [g[1] for g in got], [g[2] for g in got], wall

    def close(self) -> None:
        self.pool.shutdown()
        del self.stage
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def prompts(n: int, length: int, vocab: int, seed: int) -> Tokens:
    g = torch.Generator().manual_seed(seed)
    return [[1, *torch.randint(3, vocab, (length - 1,), generator=g).tolist()] for _ in range(n)]
