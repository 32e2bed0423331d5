"""Prefill steps: compiled prompt rows (`engine/prompt_graph.py`) against the eager layers.

`tessera bench prefill --json [--quick] [--threads N] [--batch B] [--prompt-len L]
[--new-tokens N] [--tune-malloc]`. One stage holding the default tiny checkpoint (packed
projections, eager decode) serves `--batch` prompts of `--prompt-len` tokens (default 128 x 64)
to `--new-tokens` tokens (default 1: prefill only), with the compiled prompt rows on and off
alternately in every round on the same weights. Keys: `prompt_warmup_s` (compiling or loading
from Inductor's cache); `{eager,compiled}_{wall,cpu}_s` (medians); `cpu_ratio`, `wall_ratio`
(medians of per-round eager / compiled, > 1: compiled is cheaper); `tokens_match`,
`compiled_steps`, `recompiles`; `malloc_tuned` (`--tune-malloc` set the agent's malloc
thresholds as `tessera agent` does).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import statistics
import tempfile
import time
from typing import Any

import torch

from tessera_agent import engine_batch
from tessera_agent.engine import (
    decode_graph,
    host_malloc,
    packed_linear,
    prompt_graph,
    sampling,
    stage,
)

Tokens = engine_batch.Tokens


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="2 rounds, 32 prompts")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per path")
    parser.add_argument("--batch", type=int, default=128, help="prompts per round")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=1, help="1: prefill only")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: as set)")
    parser.add_argument(
        "--tune-malloc",
        action="store_true",
        help="set the agent's malloc thresholds first (`engine/host_malloc.py`)",
    )


class _Inline(concurrent.futures.Executor):
    """Runs each step on the calling thread (no hand-off between threads in the timing)."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            fut.set_exception(exc)
        return fut


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    tuned = host_malloc.tune() if args.tune_malloc else False
    rounds, batch = (2, min(args.batch, 32)) if args.quick else (args.rounds, args.batch)
    with tempfile.TemporaryDirectory() as tmp:
        path, cfg = engine_batch.tiny(tmp)
        st = stage.load_stage(
            stage.BlockSpec(str(path), 0, cfg.num_layers, kv_bytes=256 << 20),
            torch.device("cpu"),
            1 << 31,
        )
        r = st.runner
        graph = decode_graph.CompiledDecode(r.model, r.device, r.page_size)
        graph.state = "warming"  # decode steps eager: only the prompt rows differ
        packs = graph.packs = packed_linear.StagePacks(r.model)
        r.decode_graph = graph
        pg = prompt_graph.PromptGraph(r.model)
        warm_s = pg.warm_up(r.model, packs)
        warmed = pg.compiles
        g = torch.Generator().manual_seed(1234)
        ids = torch.randint(5, cfg.vocab_size, (batch, args.prompt_len), generator=g)
        ids[:, 0] = cfg.bos_token_id if cfg.bos_token_id is not None else 1
        prompts = [row.tolist() for row in ids]
        params = sampling.SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
        pool = _Inline()
        counter = iter(range(10**9))

        async def generate() -> Tokens:
            return await engine_batch.generate(
                r, pool, cfg.max_positions, prompts, params, counter, prefix="p"
            )

        def timed(on: bool) -> tuple[Tokens, float, float]:
            packs.graph = pg if on else None
            t, c = time.perf_counter(), time.process_time()
            out = asyncio.run(generate())
            return out, time.perf_counter() - t, time.process_time() - c

        timed(False)  # warm-up round of each path
        timed(True)
        walls: dict[bool, list[float]] = {False: [], True: []}
        cpus: dict[bool, list[float]] = {False: [], True: []}
        outs: dict[bool, Tokens] = {}
        for i in range(rounds):
            for on in (False, True) if i % 2 == 0 else (True, False):
                outs[on], wall, cpu = timed(on)
                walls[on].append(wall)
                cpus[on].append(cpu)
        calls = pg.calls
    med = statistics.median
    return {
        "batch": batch,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "threads": torch.get_num_threads(),
        "malloc_tuned": tuned,
        "rounds": rounds,
        "prompt_warmup_s": round(warm_s, 2),
        "eager_wall_s": round(med(walls[False]), 3),
        "compiled_wall_s": round(med(walls[True]), 3),
        "eager_cpu_s": round(med(cpus[False]), 3),
        "compiled_cpu_s": round(med(cpus[True]), 3),
        "cpu_ratio": round(med(a / b for a, b in zip(cpus[False], cpus[True], strict=True)), 3),
        "wall_ratio": round(med(a / b for a, b in zip(walls[False], walls[True], strict=True)), 3),
        "tokens_match": outs[False] == outs[True],
        "compiled_steps": calls,
        "recompiles": pg.compiles - warmed,
    }
