"""`tessera bench speculate`'s engine path: speculation inside the replica engine's stepping.

A `ReplicaEngine` (continuous batching, paged KV) over a checkpoint cut into 4 equal stages in
this process; the 3 stages after the leader are a `speculative_stages.SpeculativeStages`, stage
1 (the bottleneck) sleeping `bottleneck_ms` per step and stages 2-3 `hop_ms`. Every mode serves
the same prompts as one batch, greedy, prefix caching off: `off`, `lowrank`, `pseudo` (a copy
of the stage with its own KV pool) and `pseudo_half` (wrong every other step). Per mode:
`hit_rate` (per sequence-step), `tpot_ms`, `latency_ratio` (on / off), `tokens_equal`.
`inflight` is how many steps the leader keeps in the stages: 1 (speculation can hide the stages
after the bottleneck) or 2 (pipelined: nothing to hide, a miss costs). Called by
`bench_speculate.run`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from tessera_agent import speculative_stages
from tessera_agent.engine import replica, runner, sampling, scheduler, stage, step

KV_BYTES = 16 << 20


class _Pseudo:
    """A copy of the bottleneck stage (its own KV pool), wrong every other call if `half`."""

    def __init__(self, copy: runner.StageRunner, half: bool) -> None:
        self.copy, self.half, self.calls = copy, half, 0

    def __call__(self, inp: step.StepInput) -> torch.Tensor:
        out = self.copy.execute(inp).hidden
        assert out is not None
        self.calls += 1
        return out + 1.0 if self.half and self.calls % 2 == 0 else out


def _load(path: Path, bounds: list[int]) -> list[stage.Stage]:
    return [
        stage.load_stage(
            stage.BlockSpec(str(path), a, b, stage_index=i, kv_bytes=KV_BYTES),
            torch.device("cpu"),
            1 << 30,
        )
        for i, (a, b) in enumerate(itertools.pairwise(bounds))
    ]


async def _serve(
    stages: list[stage.Stage],
    ds: speculative_stages.SpeculativeStages,
    prompts: list[list[int]],
    new: int,
    inflight: int,
) -> tuple[list[list[int]], list[float]]:
    """Every prompt at once through the engine; tokens and each request's TPOT."""
    pool = concurrent.futures.ThreadPoolExecutor(1)

    async def connect() -> replica.Downstream:
        return ds

    cfg = scheduler.SchedulerConfig(
        max_model_len=stages[0].cfg.max_positions,
        eos_token_ids=stages[0].cfg.eos_token_ids,
        prefix_caching=False,
    )
    eng = replica.ReplicaEngine(stages[0].runner, pool, cfg, connect, inflight)
    params = sampling.SamplingParams(max_tokens=new, ignore_eos=True)

    async def one(i: int) -> tuple[list[int], float]:
        toks, times = [], []
        async for ev in eng.generate(f"s{i}", prompts[i], params):
            if ev.token is not None:
                toks.append(ev.token)
                times.append(time.perf_counter())
        return toks, (times[-1] - times[0]) / max(1, len(times) - 1)

    try:
        got = await asyncio.gather(*(one(i) for i in range(len(prompts))))
    finally:
        await eng.close()
        pool.shutdown()
    return [t for t, _ in got], [s for _, s in got]


def speculation_run(
    tpot_s: float,
    off_s: float,
    hit_rate: float | None,
    speculated_steps: int,
    mixed_steps: int,
    tokens_equal: bool,
) -> dict[str, Any]:
    """One speculating run's row of the JSON, its TPOT against `off_s` (no speculation);
    also the agents' path's (`tessera.cli.bench_speculate`)."""
    return {
        "hit_rate": None if hit_rate is None else round(hit_rate, 3),
        "speculated_steps": speculated_steps,
        "mixed_steps": mixed_steps,
        "tpot_ms": round(tpot_s * 1000, 2),
        "latency_ratio": round(tpot_s / off_s, 3),
        "tokens_equal": tokens_equal,
    }


def run(
    path: Path,
    bounds: list[int],
    lowrank: Any,
    prompts: list[list[int]],
    new: int,
    rounds: int,
    bottleneck_ms: float,
    hop_ms: float,
    oracle: list[list[int]],
    inflight: int = 1,
) -> dict[str, Any]:
    """The engine path's runs (module docstring), `inflight` steps at once in the chain."""
    delays = {0: bottleneck_ms / 1000.0, 1: hop_ms / 1000.0, 2: hop_ms / 1000.0}
    modes = ("off", "lowrank", "pseudo", "pseudo_half")
    tpot: dict[str, list[float]] = {m: [] for m in modes}
    tokens: dict[str, list[list[int]]] = {}
    stats: dict[str, speculative_stages.SpeculationStats] = {}
    for _ in range(rounds):  # the modes take turns, so drift in the load hits all alike
        for mode in modes:
            stages = _load(path, bounds)
            sur: speculative_stages.Surrogate
            if mode.startswith("pseudo"):
                copy = _load(path, [0, bounds[1], bounds[2]])[1].runner
                sur = _Pseudo(copy, mode == "pseudo_half")
            else:
                sur = _rows(lowrank)
            ds = speculative_stages.SpeculativeStages(
                [s.runner for s in stages[1:]], 0, sur, delay_s=delays, enabled=mode != "off"
            )
            tokens[mode], times = asyncio.run(_serve(stages, ds, prompts, new, inflight))
            tpot[mode] += times
            stats[mode] = ds.stats
    off = statistics.median(tpot["off"])
    runs: dict[str, Any] = {
        "off": {"tpot_ms": round(off * 1000, 2), "tokens_equal_oracle": tokens["off"] == oracle}
    }
    for mode in modes[1:]:
        t = statistics.median(tpot[mode])
        st = stats[mode]
        runs[mode] = speculation_run(
            t, off, st.hit_rate, st.speculated_steps, st.mixed_steps, tokens[mode] == tokens["off"]
        )
    return {
        "label": "measured, this machine's CPU (float32), in-process replica engine "
        "(continuous batching, paged KV), delays made on purpose",
        "batch": len(prompts),
        "steps_in_flight": inflight,
        "runs": runs,
    }


def _rows(lowrank: Any) -> speculative_stages.Surrogate:
    def guess(inp: step.StepInput) -> torch.Tensor:
        assert inp.hidden is not None
        out: torch.Tensor = lowrank(inp.hidden.float())
        return out

    return guess
