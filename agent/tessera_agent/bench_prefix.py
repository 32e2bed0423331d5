"""Prefix caching: time to first token of requests that share a long prompt prefix.

`tessera bench prefix --json [--quick]`. In this process, on the default tiny checkpoint
(whole model, one stage): each round, a fresh engine with prefix caching on and one with
it off each serve `--requests` requests one after another; every prompt is the same
`--prefix` tokens (a long system prompt) followed by `--suffix` tokens of its own, and asks
for one token. Reported: median TTFT of the requests after the first (the first fills the
cache), the median of per-round speed-ups, the prompt tokens served from the cache, and
whether both engines produced the same tokens (`tokens_match`).
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

from tessera.bench import harness
from tessera_agent import engine_batch
from tessera_agent.engine import replica, sampling, scheduler, stage


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="2 rounds, 4 requests")
    parser.add_argument("--prefix", type=int, default=768, help="shared prompt tokens")
    parser.add_argument("--suffix", type=int, default=16, help="own prompt tokens per request")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)


async def _serve(
    st: stage.Stage, prompts: list[list[int]], caching: bool
) -> tuple[list[float], list[int], int]:
    """(TTFT per request, first tokens, prefix-hit tokens) with a fresh engine."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    cfg = scheduler.SchedulerConfig(
        max_model_len=st.cfg.max_positions, max_batched_tokens=1024, prefix_caching=caching
    )
    eng = replica.ReplicaEngine(st.runner, pool, cfg)
    params = sampling.SamplingParams(max_tokens=1, ignore_eos=True)
    ttft: list[float] = []
    tokens: list[int] = []
    try:
        for i, p in enumerate(prompts):
            t = time.perf_counter()
            async for ev in eng.generate(f"p{i}", p, params):
                if ev.token is not None:
                    ttft.append(time.perf_counter() - t)
                    tokens.append(ev.token)
        return ttft, tokens, eng.stats().prefix_hit_tokens
    finally:
        await eng.close()
        pool.shutdown()


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 2 if args.quick else args.rounds
    n = 4 if args.quick else args.requests
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp:
        path, cfg = engine_batch.tiny(tmp)
        if args.prefix + args.suffix >= cfg.max_positions:
            raise SystemExit(f"--prefix + --suffix must stay below {cfg.max_positions}")
        g = torch.Generator().manual_seed(0)
        shared = [
            cfg.bos_token_id or 0,
            *torch.randint(5, cfg.vocab_size, (args.prefix - 1,), generator=g).tolist(),
        ]
        prompts = [
            shared + torch.randint(5, cfg.vocab_size, (args.suffix,), generator=g).tolist()
            for _ in range(n)
        ]
        pages = -(-(args.prefix + args.suffix + 1) // stage.DEFAULT_PAGE_SIZE) * n
        layout_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4
        spec = stage.BlockSpec(
            str(path), 0, cfg.num_layers, kv_bytes=pages * stage.DEFAULT_PAGE_SIZE * layout_bytes
        )
        st = stage.load_stage(spec, torch.device("cpu"), 1 << 32)
        asyncio.run(_serve(st, prompts[:1], False))  # warm-up
        on: list[float] = []
        off: list[float] = []
        ratios: list[float] = []
        match, hits = True, 0
        for _ in range(rounds):
            t_on, tok_on, hits = asyncio.run(_serve(st, prompts, True))
            t_off, tok_off, _ = asyncio.run(_serve(st, prompts, False))
            match = match and tok_on == tok_off
            on.append(statistics.median(t_on[1:]))
            off.append(statistics.median(t_off[1:]))
            ratios.append(off[-1] / on[-1])
    return {
        "ttft_cached_ms": round(1000 * statistics.median(on), 2),
        "ttft_uncached_ms": round(1000 * statistics.median(off), 2),
        "cached_vs_uncached_ttft": round(statistics.median(ratios), 2),
        "prefix_hit_tokens": hits,
        "tokens_match": match,
        "prefix_tokens": args.prefix,
        "suffix_tokens": args.suffix,
        "requests": n,
        "rounds": rounds,
        "torch_threads": torch.get_num_threads(),
        "machine": harness.machine(f"torch {torch.__version__}"),
    }
