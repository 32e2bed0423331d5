"""Tensor-parallel throughput: tp=2 against tp=1 at batch 8, and token equality.

`tessera bench tp --json [--quick]`. One run on the default tiny checkpoint (generated into
a temporary folder), greedy, EOS ignored so every request yields the same token count:
- `tp1_tok_s_b8`: the engine with the whole model in this process, all torch threads;
- `tp2_tok_s_b8`: the same replica sharded over 2 TP ranks, rank 0 in this process and
  rank 1 in a spawned process, each with half the threads, all-reducing over gloo;
- `tp2_vs_tp1_b8`: median of the per-round tp2/tp1 speed ratios (rounds interleaved);
- `tokens_match`: tp=2 produced exactly tp=1's tokens (tp=1 is held to `transformers`
  by the engine's oracle tests, and tp=2 too by `tests/engine/test_tp_vs_hf.py`).
On a CPU box the two ranks share the same cores and memory bandwidth, and every layer
pays two all-reduces over loopback TCP, so tp=2 is expected to be slower than tp=1 here;
TP pays off when each rank brings its own device and memory.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tessera.bench import harness
from tessera_agent import bench_engine, engine_batch, tiny_checkpoint, tp_local
from tessera_agent.engine import config, sampling, stage

Tokens = engine_batch.Tokens


def add_arguments(parser: argparse.ArgumentParser) -> None:
    engine_batch.add_arguments(parser)
    parser.add_argument("--model", type=Path, default=None, help="checkpoint (default: tiny)")


def _generator(
    stages: list[stage.Stage], prompts: Tokens, new: int, max_len: int
) -> Callable[[], Tokens]:
    pool = concurrent.futures.ThreadPoolExecutor(1)
    params = sampling.SamplingParams(max_tokens=new, ignore_eos=True)
    counter = iter(range(10**9))

    async def run() -> Tokens:
        return await engine_batch.generate(
            stages[0].runner, pool, max_len, prompts, params, counter
        )

    return lambda: asyncio.run(run())


def run(args: argparse.Namespace) -> dict[str, Any]:
    new = 16 if args.quick else args.new_tokens
    rounds = 2 if args.quick else args.rounds
    threads = torch.get_num_threads()
    half = max(1, threads // 2)
    with tempfile.TemporaryDirectory(prefix="tessera-bench-tp-") as tmp:
        model_path = args.model or tiny_checkpoint.make_tiny(
            Path(tmp) / "tiny", tiny_checkpoint.TinySpec()
        )
        cfg = config.ModelConfig.from_path(model_path)
        prompts = bench_engine._prompts(8, args.prompt_len, cfg.vocab_size, cfg.bos_token_id or 0)
        whole = stage.load_stage(
            stage.BlockSpec(str(model_path), 0, cfg.num_layers, kv_bytes=64 << 20),
            torch.device("cpu"),
            1 << 30,
        )
        tp1 = _generator([whole], prompts, new, cfg.max_positions)
        rep = tp_local.TPReplica(
            model_path, [(0, cfg.num_layers)], 2, kv_bytes=64 << 20, follower_threads=half
        )
        try:
            tp2 = _generator(rep.stages, prompts, new, cfg.max_positions)

            def tp1_run() -> Tokens:
                torch.set_num_threads(threads)
                return tp1()

            def tp2_run() -> Tokens:
                torch.set_num_threads(half)
                return tp2()

            t1_toks, t2_toks, t1, t2, ratio = bench_engine._interleaved(tp1_run, tp2_run, rounds)
        finally:
            rep.close()
            torch.set_num_threads(threads)
    return {
        "tp1_tok_s_b8": round(8 * new / t1, 1),
        "tp2_tok_s_b8": round(8 * new / t2, 1),
        "tp2_vs_tp1_b8": round(ratio, 3),
        "tokens_match": t1_toks == t2_toks,
        "transport": "gloo",
        "new_tokens": new,
        "prompt_len": args.prompt_len,
        "rounds": rounds,
        "torch_threads": threads,
        "machine": harness.machine(f"torch {torch.__version__}"),
    }
