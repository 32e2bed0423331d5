"""KV move against recompute: continuing a long request on another replica.

`tessera bench kvmove --json [--quick]`. Two agent processes with one thread each, each
leading a whole-model replica of the default tiny checkpoint. Each round takes two fresh
prompts of `--prompt` tokens and runs them on the source replica (their K/V is then in its
prefix cache). Then, on the target replica: the first prompt is continued cold (time to
first token = recomputing the prefill), the second is moved with
`tessera.control.kv_move.move_prefix` over the data plane (agent to agent over gloo) and then
continued (move time + time to first token), and the third is moved over the gRPC
streams (the fallback), interleaved in the same round. Reported: medians over rounds, the
median of per-round speed-ups (`recompute_vs_move`, `dataplane_vs_grpc_move`), the
transport that carried the data-plane move (`transport`), the bytes moved, and whether
the moved requests' tokens equal the source's (`tokens_match`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

import torch

from tessera.bench import harness
from tessera.cli import local_agents
from tessera.control import kv_move
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import engine_batch
from tessera_agent.engine import kv_cache


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="2 rounds, 256-token prompts")
    parser.add_argument("--prompt", type=int, default=768, help="prompt tokens")
    parser.add_argument("--rounds", type=int, default=5)


def _timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 2 if args.quick else args.rounds
    length = 256 if args.quick else args.prompt
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp:
        path, cfg = engine_batch.tiny(tmp)
        if length >= cfg.max_positions:
            raise SystemExit(f"--prompt must stay below {cfg.max_positions}")
        g = torch.Generator().manual_seed(0)
        with local_agents.local_agents(2, "cpu:1x2GiB", 1, "kvmove") as (a, b):
            for agent, rid in ((a, "src"), (b, "dst")):
                local_agents.load_pipeline(
                    [agent], str(path), [(0, cfg.num_layers)], rid, 256 << 20
                )
            src = pb_grpc.AgentStub(transport.sync_channel(a.address, a.tls))
            dst = pb_grpc.AgentStub(transport.sync_channel(b.address, b.tls))
            src_ref = [kv_move.StageRef(a.address, "src", 0, 0, cfg.num_layers)]
            dst_ref = [kv_move.StageRef(b.address, "dst", 0, 0, cfg.num_layers)]
            recompute: list[float] = []
            moved: list[float] = []
            move_only: list[float] = []
            move_grpc: list[float] = []
            match, pages, used = True, 0, ""
            for _ in range(rounds + 1):  # the first round warms up
                cold, warm, warm_grpc = (
                    [
                        cfg.bos_token_id or 0,
                        *torch.randint(5, cfg.vocab_size, (length - 1,), generator=g).tolist(),
                    ]
                    for _ in range(3)
                )
                gen = local_agents.generate_tokens
                gen(src, "src", cold, 1)
                want = gen(src, "src", warm, 4)
                want_grpc = gen(src, "src", warm_grpc, 4)
                t_cold, _ = _timed(lambda: gen(dst, "dst", cold, 1))  # noqa: B023
                t_move, info = _timed(
                    lambda: asyncio.run(kv_move.move_prefix(warm, src_ref, dst_ref, tls=a.tls))  # noqa: B023
                )
                t_first, _ = _timed(lambda: gen(dst, "dst", warm, 1))  # noqa: B023
                t_grpc, _ = _timed(
                    lambda: asyncio.run(
                        kv_move.move_prefix(warm_grpc, src_ref, dst_ref, via="grpc", tls=a.tls)  # noqa: B023
                    )
                )
                match = match and gen(dst, "dst", warm, 4) == want
                match = match and gen(dst, "dst", warm_grpc, 4) == want_grpc
                recompute.append(t_cold)
                move_only.append(t_move)
                moved.append(t_move + t_first)
                move_grpc.append(t_grpc)
                pages, used = info.pages, info.transport
    page_bytes = kv_cache.KVLayout(
        cfg.num_layers, 1, 16, cfg.num_kv_heads, cfg.head_dim
    ).bytes_per_page
    r, m, mo, mg = recompute[1:], moved[1:], move_only[1:], move_grpc[1:]
    return {
        "recompute_ttft_ms": round(1000 * statistics.median(r), 2),
        "move_ms": round(1000 * statistics.median(mo), 2),
        "move_then_ttft_ms": round(1000 * statistics.median(m), 2),
        "move_grpc_ms": round(1000 * statistics.median(mg), 2),
        "dataplane_vs_grpc_move": round(
            statistics.median(g / d for g, d in zip(mg, mo, strict=True)), 2
        ),
        "recompute_vs_move": round(statistics.median(x / y for x, y in zip(r, m, strict=True)), 2),
        "moved_tokens": pages * 16,
        "moved_bytes": pages * page_bytes,
        "tokens_match": match,
        "prompt_tokens": length,
        "rounds": rounds,
        "transport": used,  # of the data-plane move: gloo here (nccl between CUDA devices)
        "agents": "2 processes, 1 thread each",
        "machine": harness.machine(f"torch {torch.__version__}"),
    }
