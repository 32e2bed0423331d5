"""A stitched chain across two widths against the large model alone, in-process and served.

`tessera bench stitch --json [--quick] [--family DIR] [--zoo DIR] [--no-served]`. First
`tessera_agent.bench_stitch`'s in-process figures (its `tpot_ratio` renamed
`inprocess_tpot_ratio`). Then, served through one `tessera agent` process (one torch thread,
block zoo on): the large model whole and the stitched chain as two blocks (the small front
applying the stitch, the large tail sharing the whole model's layers), asked the same greedy
requests in turn, three rounds. `tpot_ratio`: median time per output token, chain / large,
from streamed arrivals; `served.tokens_equal`: every served chain's tokens equal the same chain
run in-process in float32. It lives in the CLI because it starts an agent process.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tessera.bench import client

CHAIN_KV_BYTES = 16 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tessera_agent import bench_stitch

    bench_stitch.add_arguments(parser)
    parser.add_argument(
        "--no-served", action="store_true", help="skip the served measurement (no agent)"
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tessera_agent import bench_stitch, tiny_family

    with tempfile.TemporaryDirectory() as tmp:
        made_s = None
        if not args.family:  # made here, so the served part can read it after the in-process one
            began = time.perf_counter()
            args.family = str(Path(tmp) / "family")
            tiny_family.make_family(Path(args.family), steps=80 if args.quick else 200)
            made_s = round(time.perf_counter() - began, 1)
        if not args.zoo:
            args.zoo = str(Path(tmp) / "zoo")
        out = bench_stitch.run(args)
        if made_s is not None:
            out["family"]["made_s"] = made_s
        out["inprocess_tpot_ratio"] = out.pop("tpot_ratio")
        out["inprocess_tpot_ms_large"] = out.pop("tpot_ms_large")
        out["inprocess_tpot_ms_stitched"] = out.pop("tpot_ms_stitched")
        if args.no_served:
            return out
        point = (out["served_point"][0], out["served_point"][1])
        new = 8 if args.quick else args.tokens
        served = asyncio.run(_served(Path(args.family), Path(args.zoo), point, new))
        out["served"] = served
        out["tpot_ratio"] = served["tpot_ratio"]
        out["label"] += "; tpot_ratio served through one local agent process"
        return out


async def _served(family: Path, zoo: Path, point: tuple[int, int], new: int) -> dict[str, Any]:
    """The large model whole and the stitched chain, served by one agent (module docstring)."""
    import torch

    from tessera import blocks, model_facts
    from tessera.cli import bench_agent_proc
    from tessera.rpc import blocks as rpc_blocks
    from tessera.rpc.v1 import agent_pb2 as pb
    from tessera_agent import bench_stitch, stitch

    small, large = str(family / "small"), str(family / "large")
    layers = model_facts.num_layers(family / "large")
    agent = bench_agent_proc.AgentProc("stitch-bench", 2 << 30, zoo=True)
    try:
        here = agent.proc.address
        whole = blocks.Block(large, 0, layers, replica_id="large", kv_bytes=CHAIN_KV_BYTES)
        tail = blocks.Block(
            large,
            point[1],
            layers,
            replica_id="stitched",
            stage_index=1,
            num_stages=2,
            kv_bytes=CHAIN_KV_BYTES,
        )
        front = blocks.Block(
            small,
            0,
            point[0],
            replica_id="stitched",
            num_stages=2,
            next_address=here,
            kv_bytes=CHAIN_KV_BYTES,
            stitch_zoo=str(zoo),
            stitch_to=large,
            stitch_at=point[1],
        )
        for b in (whole, tail, front):
            await agent.stub.LoadBlock(rpc_blocks.load_request(b), timeout=120)
        gaps: dict[str, list[float]] = {"large": [], "stitched": []}
        tokens: dict[str, list[list[int]]] = {}
        for _ in range(3):  # alternate, so drift in the machine's load hits both alike
            for rid in ("large", "stitched"):
                tokens[rid] = []
                for prompt in bench_stitch.PROMPTS:
                    got, times = await client.agent_greedy(agent.stub, pb, rid, prompt, new)
                    tokens[rid].append(got)
                    if len(times) > 1:  # tokens may arrive several to a chunk
                        gaps[rid].append((times[-1] - times[0]) / (len(times) - 1))
        torch.set_num_threads(1)
        chain = stitch.StitchedChain.from_zoo(zoo, family / "small", family / "large", point)
        oracle = [chain.generate(p, new)[0] for p in bench_stitch.PROMPTS]
        d = await agent.describe()
        held = {(b.replica_id, b.stage_index): b for b in d.blocks}
        t_large, t_chain = statistics.median(gaps["large"]), statistics.median(gaps["stitched"])
        return {
            "label": "measured: one local agent process on this machine's CPU, one torch "
            "thread, float32; median over requests of (last token - first token) / tokens",
            "tpot_ms_large": round(t_large * 1000, 3),
            "tpot_ms_stitched": round(t_chain * 1000, 3),
            "tpot_ratio": round(t_chain / t_large, 3),
            "tokens_equal": tokens["stitched"] == oracle,
            "tail_shared_param_bytes": held[("stitched", 1)].shared_param_bytes,
            "tail_param_bytes": held[("stitched", 1)].param_bytes,
            "front_param_bytes": held[("stitched", 0)].param_bytes,
            "stitch": {
                "cosine": round(held[("stitched", 0)].stitch.cosine, 4),
                "top1_agreement": round(held[("stitched", 0)].stitch.top1_agreement, 4),
            },
        }
    finally:
        await agent.close()
