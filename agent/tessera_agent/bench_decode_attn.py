"""Decode attention in the compiled decode graph: fused slot-indexed reductions vs gather + SDPA.

`tessera bench decode-attn --json [--quick] [--threads N]`. On the default tiny checkpoint
(generated into a temporary folder, float32), one process builds two `CompiledDecode` graphs
over the same layers: one tracing `attention._decode_fused` (the default), one tracing eager's
gather + SDPA (`TESSERA_DECODE_ATTN=gather`). Per (batch, context range) it draws random
contexts and pages over a noise-filled KV pool and times whole decode steps through each
graph, alternating round by round. Reported per shape (`b{B}_ctx{lo}_{hi}`): median CPU and
wall milliseconds per step for each path (`*_wall_min_ms`: the fastest round), `cpu_speedup`
(gather / fused, median of per-round ratios), `max_abs_diff` between the paths' hidden
states, and `recompiles` after the warm-ups (0 expected).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tessera.bench import harness
from tessera_agent import tiny_checkpoint
from tessera_agent.engine import attention, config, decode_graph, stage

SHAPES = ((1, 64, 96), (8, 64, 96), (8, 200, 300), (32, 64, 96), (64, 200, 300), (128, 64, 96))
QUICK_SHAPES = ((1, 64, 96), (8, 64, 96), (128, 64, 96))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="3 shapes, 3 rounds")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5, help="steps per path per round")
    parser.add_argument(
        "--shapes", default="", help="batch:lo:hi,... (default: six shapes from 1 to 128)"
    )


def _inputs(
    b: int, lo: int, hi: int, ps: int, like: torch.Tensor, layers: int, seed: int
) -> tuple[list[attention.ChunkGeometry], decode_graph.KV, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (b,), generator=g).tolist()
    npages = [-(-n // ps) for n in lens]
    pool_pages = sum(npages) + 1
    perm = torch.randperm(pool_pages, generator=g).tolist()
    chunks, at = [], 0
    for n, k in zip(lens, npages, strict=True):
        chunks.append(attention.ChunkGeometry(n - 1, 1, tuple(perm[at : at + k])))
        at += k
    shape = (pool_pages * ps, *like.shape[1:])
    kv = [(torch.randn(shape, generator=g), torch.randn(shape, generator=g)) for _ in range(layers)]
    with torch.inference_mode():  # as the runner makes its step inputs
        x = torch.randint(0, 500, (b,), generator=g)
    return chunks, kv, x


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    shapes: tuple[tuple[int, int, int], ...] = QUICK_SHAPES if args.quick else SHAPES
    if args.shapes:
        shapes = tuple(
            (int(b), int(lo), int(hi))
            for b, lo, hi in (part.split(":") for part in args.shapes.split(","))
        )
    rounds = 3 if args.quick else args.rounds
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_checkpoint.make_tiny(Path(tmp) / "tiny", tiny_checkpoint.TinySpec())
        cfg = config.ModelConfig.from_path(path)
        spec = stage.BlockSpec(str(path), 0, cfg.num_layers, kv_bytes=64 << 20)
        st = stage.load_stage(spec, torch.device("cpu"), 1 << 31)  # eager: options' default
        r = st.runner
        graphs: dict[str, decode_graph.CompiledDecode] = {}
        warm: dict[str, float] = {}
        for name in ("gather", "fused"):
            gr = decode_graph.CompiledDecode(r.model, r.device, r.page_size)
            gr.fused_attention = name == "fused"
            warm[name] = round(gr.warm_up(r.cache.layers()), 1)
            graphs[name] = gr
        compiled = {k: g.compiles for k, g in graphs.items()}
        out: dict[str, Any] = {
            "threads": args.threads,
            "machine": harness.machine(),
            "warmup_s": warm,
        }
        like = r.cache.layers()[0][0]
        for i, (b, lo, hi) in enumerate(shapes):
            chunks, kv, x = _inputs(b, lo, hi, r.page_size, like, cfg.num_layers, i)
            cpu: dict[str, list[float]] = {k: [] for k in graphs}
            wall: dict[str, list[float]] = {k: [] for k in graphs}
            res: dict[str, torch.Tensor] = {}
            with torch.inference_mode():
                for rnd in range(rounds + 1):  # round 0 warms caches, not counted
                    for name, gr in graphs.items():
                        md = attention.build_metadata(chunks, r.page_size, r.device)
                        c0, w0 = time.process_time(), time.perf_counter()
                        for _ in range(args.steps):
                            h = gr(x, md, kv)
                        c1, w1 = time.process_time(), time.perf_counter()
                        assert h is not None, f"{name} graph did not run (state {gr.state})"
                        res[name] = h
                        if rnd:
                            cpu[name].append((c1 - c0) / args.steps * 1e3)
                            wall[name].append((w1 - w0) / args.steps * 1e3)
            ratio = [g_ / f_ for g_, f_ in zip(cpu["gather"], cpu["fused"], strict=True)]
            out[f"b{b}_ctx{lo}_{hi}"] = {
                "gather_cpu_ms": round(statistics.median(cpu["gather"]), 3),
                "fused_cpu_ms": round(statistics.median(cpu["fused"]), 3),
                "gather_wall_ms": round(statistics.median(wall["gather"]), 3),
                "fused_wall_ms": round(statistics.median(wall["fused"]), 3),
                "gather_wall_min_ms": round(min(wall["gather"]), 3),
                "fused_wall_min_ms": round(min(wall["fused"]), 3),
                "cpu_speedup": round(statistics.median(ratio), 3),
                "max_abs_diff": float((res["gather"] - res["fused"]).abs().max()),
            }
        out["recompiles"] = sum(g.compiles - compiled[k] for k, g in graphs.items())
    return out
