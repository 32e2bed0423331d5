"""Engine throughput against Hugging Face transformers, single agent vs 2-stage pipeline.

`tessera bench engine --json [--quick]`. All figures come from one run on the default tiny
checkpoint (generated into a temporary folder), greedy, 64 new tokens per request, EOS
ignored on both sides so every request produces the same number of tokens:
- `hf_tok_s_b{1,8}`: `transformers` `generate` in this process;
- `engine_tok_s_b{1,8}`: the Tessera engine in this process (same torch threads as HF);
- `single_agent_tok_s_b8`: one agent process holding the whole model, driven over gRPC;
- `pipeline2_tok_s_b8`: two agent processes (layers 0-4 and 4-8), driven over gRPC, each
  agent with half the threads of the single agent so both use the same cores.
Each figure is the median of `--repeats` timed runs after one warm-up run.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tessera import local_agents
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import tiny_checkpoint
from tessera_agent.engine import config, replica, sampling, scheduler, stage


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="1 timed repeat, 16 new tokens")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="checkpoint to use (default: a fresh default tiny checkpoint)",
    )


def _prompts(n: int, length: int, vocab: int, bos: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(5, vocab, (n, length), generator=g)
    ids[:, 0] = bos
    return [row.tolist() for row in ids]


def _timed(fn: Any, repeats: int) -> tuple[Any, float]:
    """Run fn once to warm up, then `repeats` times; (last result, median seconds)."""
    fn()
    times, result = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return result, statistics.median(times)


def _hf(
    model_path: Path, prompts: list[list[int]], new: int, repeats: int
) -> tuple[list[list[int]], float, float]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_path)
    hf.generation_config.eos_token_id = None  # never stop early: fixed token counts
    ids = torch.tensor(prompts)

    def gen(b: int) -> list[list[int]]:
        out = hf.generate(  # type: ignore[misc]
            ids[:b],
            attention_mask=torch.ones_like(ids[:b]),
            do_sample=False,
            max_new_tokens=new,
            pad_token_id=0,
        )
        return [row[ids.shape[1] :].tolist() for row in out]

    _, t1 = _timed(lambda: gen(1), repeats)
    toks8, t8 = _timed(lambda: gen(8), repeats)
    return toks8, new / t1, 8 * new / t8


def _engine(
    model_path: Path, prompts: list[list[int]], new: int, repeats: int
) -> tuple[list[list[int]], float, float]:
    st = stage.load_stage(
        stage.BlockSpec(
            str(model_path),
            0,
            config.ModelConfig.from_path(model_path).num_layers,
            kv_bytes=64 << 20,
        ),
        torch.device("cpu"),
        1 << 30,
    )
    pool = concurrent.futures.ThreadPoolExecutor(1)
    params = sampling.SamplingParams(max_tokens=new, ignore_eos=True)
    counter = iter(range(10**9))

    async def run(b: int) -> list[list[int]]:
        eng = replica.ReplicaEngine(
            st.runner, pool, scheduler.SchedulerConfig(max_model_len=st.cfg.max_positions)
        )

        async def one(p: list[int]) -> list[int]:
            return [
                ev.token
                async for ev in eng.generate(f"r{next(counter)}", p, params)
                if ev.token is not None
            ]

        try:
            return list(await asyncio.gather(*(one(p) for p in prompts[:b])))
        finally:
            await eng.close()

    _, t1 = _timed(lambda: asyncio.run(run(1)), repeats)
    toks8, t8 = _timed(lambda: asyncio.run(run(8)), repeats)
    pool.shutdown()
    return toks8, new / t1, 8 * new / t8


async def _generate_all(
    address: str, replica_id: str, prompts: list[list[int]], new: int
) -> list[list[int]]:
    channel = transport.channel(address)
    stub = pb_grpc.AgentStub(channel)
    params = pb.SamplingParams(max_tokens=new, ignore_eos=True)

    async def one(i: int, p: list[int]) -> list[int]:
        toks: list[int] = []
        async for ch in stub.Generate(
            pb.GenerateRequest(
                replica_id=replica_id,
                request_id=f"{time.monotonic_ns()}-{i}",
                prompt_token_ids=p,
                params=params,
            )
        ):
            toks.extend(ch.token_ids)
        return toks

    try:
        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
    finally:
        await channel.close()


def _agents(
    model_path: Path,
    prompts: list[list[int]],
    new: int,
    repeats: int,
    splits: list[tuple[int, int]],
    threads: int,
) -> tuple[list[list[int]], float]:
    with local_agents.local_agents(
        len(splits), devices="cpu:1x1GiB", threads=threads, prefix="bench"
    ) as agents:
        for i in reversed(range(len(splits))):
            a, b = splits[i]
            stub = pb_grpc.AgentStub(transport.sync_channel(agents[i].address))
            stub.LoadBlock(
                pb.LoadBlockRequest(
                    model_path=str(model_path),
                    layer_start=a,
                    layer_end=b,
                    device="cpu:0",
                    replica_id="bench",
                    stage_index=i,
                    num_stages=len(splits),
                    kv_bytes=64 << 20,
                    next_stage_address=agents[i + 1].address if i + 1 < len(splits) else "",
                )
            )
        toks, t8 = _timed(
            lambda: asyncio.run(_generate_all(agents[0].address, "bench", prompts[:8], new)),
            repeats,
        )
    return toks, 8 * new / t8


def run(args: argparse.Namespace) -> dict[str, Any]:
    new = 16 if args.quick else args.new_tokens
    repeats = 1 if args.quick else args.repeats
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp:
        model_path = args.model or tiny_checkpoint.make_tiny(
            Path(tmp) / "tiny", tiny_checkpoint.TinySpec()
        )
        cfg = config.ModelConfig.from_path(model_path)
        prompts = _prompts(8, args.prompt_len, cfg.vocab_size, cfg.bos_token_id or 0)
        threads = torch.get_num_threads()
        hf_toks, hf1, hf8 = _hf(model_path, prompts, new, repeats)
        eng_toks, e1, e8 = _engine(model_path, prompts, new, repeats)
        half = cfg.num_layers // 2
        single_toks, s8 = _agents(model_path, prompts, new, repeats, [(0, cfg.num_layers)], threads)
        pipe_toks, p8 = _agents(
            model_path,
            prompts,
            new,
            repeats,
            [(0, half), (half, cfg.num_layers)],
            max(1, threads // 2),
        )
    return {
        "hf_tok_s_b1": round(hf1, 1),
        "hf_tok_s_b8": round(hf8, 1),
        "engine_tok_s_b1": round(e1, 1),
        "engine_tok_s_b8": round(e8, 1),
        "single_agent_tok_s_b8": round(s8, 1),
        "pipeline2_tok_s_b8": round(p8, 1),
        "engine_vs_hf_b8": round(e8 / hf8, 3),
        "pipeline2_vs_single_b8": round(p8 / s8, 3),
        "tokens_match": eng_toks == hf_toks and pipe_toks == hf_toks and single_toks == hf_toks,
        "new_tokens": new,
        "prompt_len": args.prompt_len,
        "repeats": repeats,
        "torch_threads": threads,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, torch {torch.__version__}",
    }
