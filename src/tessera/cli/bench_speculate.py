"""Speculation of a bottleneck block, in-process and served across two agent processes.

`tessera bench speculate --json [--quick] [--model PATH] [--no-served]`. First the
in-process figures of `tessera_agent.bench_speculate`; then `served`: two `tessera agent`
processes hold the cut `[0, L/4) [L/4, L/2) [L/2, L)` (the first two stages on A, the last
on B), the bottleneck `[L/4, L/2)` made slow on purpose (`--bottleneck-ms`). Replicas `off`,
`lowrank`, `pseudo` (right every step) and `pseudo_half` take turns over `--rounds` rounds.
Per run: `hit_rate`, `tpot_ms`, `latency_ratio` (on / off) and `tokens_equal` (against
`off`, itself checked against `transformers`). Here, not in the agent package, because it
starts agent processes.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
from pathlib import Path
from typing import Any

from tessera.bench import client

KV_BYTES = 8 << 20
RUNS = ("off", "lowrank", "pseudo", "pseudo_half")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tessera_agent import bench_speculate

    bench_speculate.add_arguments(parser)
    parser.add_argument(
        "--no-served", action="store_true", help="skip the served measurement (no agents)"
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tessera_agent import bench_speculate, tiny_checkpoint

    out = bench_speculate.run(args)
    if args.no_served:
        return out
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else Path(tmp) / "tiny"
        if not args.model:
            tiny_checkpoint.make_tiny(path, tiny_checkpoint.TinySpec())
        out["served"] = asyncio.run(_served(args, path, Path(tmp) / "zoo"))
    out["label"] += "; `served` across two local agent processes"
    return out


def _fit(path: Path, layers: tuple[int, int], rank: int) -> Any:
    import random

    import torch
    from transformers import AutoModelForCausalLM

    from tessera_agent import block_parts, surrogate

    torch.set_num_threads(1)
    auto: Any = AutoModelForCausalLM
    model = auto.from_pretrained(path, dtype=torch.float32).eval()
    n = model.config.num_hidden_layers
    parts = block_parts.cut(model, [0, layers[0], layers[1], n])
    rng = random.Random(0)
    calib = [[rng.randrange(model.config.vocab_size) for _ in range(64)] for _ in range(9)]
    return surrogate.fit_low_rank(parts, 1, calib, rank), model


async def _served(args: argparse.Namespace, path: Path, zoo: Path) -> dict[str, Any]:
    """The four replicas over two agents (module docstring)."""
    import torch

    from tessera import blocks, model_facts
    from tessera.cli import local_agents
    from tessera.rpc import blocks as rpc_blocks
    from tessera.rpc import transport
    from tessera.rpc.v1 import agent_pb2 as pb
    from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
    from tessera_agent import (
        bench_speculate,
        bench_speculate_engine,
        speculate_serve,
        surrogate_zoo,
    )

    n = model_facts.num_layers(path)
    if n < 4:
        raise SystemExit(f"--model: {n} layers do not cut into 3 stages")
    cut = [0, n // 4, n // 2, n]
    layers = (cut[1], cut[2])
    fit, model = _fit(path, layers, args.rank)
    surrogate_zoo.save(zoo / "lowrank", path, layers, fit)
    surrogate_zoo.save_pseudo(zoo / "pseudo", path, layers, "never")
    surrogate_zoo.save_pseudo(zoo / "pseudo_half", path, layers, "half")
    prompts = bench_speculate.PROMPTS[:1] if args.quick else bench_speculate.PROMPTS
    new = 8 if args.quick else args.tokens
    oracle = []
    for p in prompts:
        ids = torch.tensor([p])
        g = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        oracle.append([int(t) for t in g[0, len(p) :]])
    slow = {speculate_serve.SLOW_ENV: f"{layers[0]},{layers[1]},{args.bottleneck_ms:g}"}
    a = local_agents.start_agent("spec-a", f"cpu:1x{2 << 30}B", 1, env=slow)
    b = local_agents.start_agent("spec-b", f"cpu:1x{2 << 30}B", 1)
    channel = transport.channel(a.address, a.tls)
    stub = pb_grpc.AgentStub(channel)
    try:
        for rid in RUNS:
            zoo_of = "" if rid == "off" else str(zoo / rid)
            for i, (s, e) in enumerate(itertools.pairwise(cut)):
                blk = blocks.Block(
                    str(path),
                    s,
                    e,
                    replica_id=rid,
                    stage_index=i,
                    num_stages=3,
                    kv_bytes=KV_BYTES,
                    next_address=(a.address, b.address, "")[i],
                    speculate_zoo=zoo_of if i == 1 else "",
                )
                where = b if i == 2 else a
                ch = transport.channel(where.address, where.tls)
                try:
                    req = rpc_blocks.load_request(blk)
                    await pb_grpc.AgentStub(ch).LoadBlock(req, timeout=180)
                finally:
                    await ch.close()
        tpot: dict[str, list[float]] = {r: [] for r in RUNS}
        tokens: dict[str, list[list[int]]] = {}
        for _ in range(1 if args.quick else args.rounds):
            for rid in RUNS:  # turns, so drift in the machine's load hits all alike
                got = await asyncio.gather(
                    *(client.agent_greedy(stub, pb, rid, p, new) for p in prompts)
                )
                tokens[rid] = [t for t, _ in got]
                for _, times in got:
                    if len(times) > 1:
                        tpot[rid].append((times[-1] - times[0]) / (len(times) - 1))
        d = await stub.Describe(pb.DescribeRequest(), timeout=30)
        held = {x.replica_id: x.speculate for x in d.blocks if x.HasField("speculate")}
    finally:
        await channel.close()
        local_agents.stop_agent(a)
        local_agents.stop_agent(b)
    off = statistics.median(tpot["off"])
    same = tokens["off"] == oracle
    runs: dict[str, Any] = {
        "off": {"tpot_ms": round(off * 1000, 2), "tokens_equal_transformers": same}
    }
    for rid in RUNS[1:]:
        t = statistics.median(tpot[rid])
        s = held[rid]
        seen = s.hits + s.misses
        runs[rid] = bench_speculate_engine.speculation_run(
            t,
            off,
            s.hits / seen if seen else None,
            s.speculated_steps,
            s.mixed_steps,
            tokens[rid] == tokens["off"],
        )
    return {
        "label": "measured: two local agent processes on this machine's CPU, one torch thread "
        "each, float32; the bottleneck made slow on purpose; median over requests of "
        "(last token - first token) / tokens between",
        "stages": [[x, y] for x, y in itertools.pairwise(cut)],
        "agents": ["A", "A", "B"],
        "bottleneck": list(layers),
        "bottleneck_ms": args.bottleneck_ms,
        "batch": len(prompts),
        "lowrank_heldout_cosine": round(fit.cosine, 4),
        "hit_rate": runs["lowrank"]["hit_rate"],
        "latency_ratio": runs["lowrank"]["latency_ratio"],
        "runs": runs,
    }
