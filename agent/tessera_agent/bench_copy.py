"""Block load time: from the checkpoint on disk against a copy from a peer agent.

`tessera bench copy --json [--quick]`. Two agent processes; agent A holds the whole model,
read from the checkpoint (hidden 1024 by default, about 380 MB). Each round, agent B loads
the same block four ways, unloading it after each: from the checkpoint with its files
evicted from the page cache first (`posix_fadvise(DONTNEED)` after `fsync`, so a cold read
from this machine's disk), from the checkpoint again (warm: the page cache serves it, the
fastest a disk load gets), and as a copy from A (`LoadBlock` with a source) over each
transport: the data plane (`gloo`: a 2-rank group, tensors sent point-to-point; the
default) and the gRPC fallback (`grpc`: `FetchTensors` chunks). `load_peer_s` is the
default path; `peer_{gloo,grpc}_gb_s` the bandwidth of each, `gloo_vs_grpc` their ratio.
Times are medians over rounds, ratios medians of per-round ratios. Greedy tokens of the
copied block are compared with the source's (`tokens_match`). A cluster's checkpoint on
network storage is slower to read than this local disk; that case is not measured here.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tessera.bench import harness
from tessera.cli import local_agents
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import tiny_checkpoint
from tessera_agent.engine import config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="hidden 256, 2 rounds")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)


def _evict(model: Path) -> None:
    """Drop the checkpoint's pages from the page cache (Linux; a no-op where unsupported)."""
    for f in model.iterdir():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            with contextlib.suppress(AttributeError, OSError):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _ratio(slow: list[float], fast: list[float]) -> float:
    """Median of per-round speed-ups of `fast` over `slow`."""
    return round(harness.median_ratio(slow, fast), 3)


def run(args: argparse.Namespace) -> dict[str, Any]:
    hidden = 256 if args.quick else args.hidden
    rounds = 2 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp:
        spec = tiny_checkpoint.TinySpec(
            hidden=hidden, layers=args.layers, heads=8, kv_heads=4, vocab=512
        )
        path = tiny_checkpoint.make_tiny(Path(tmp) / "model", spec)
        cfg = config.ModelConfig.from_path(path)
        with local_agents.local_agents(2, "cpu:1x8GiB", 1, "copy") as (a, b):
            src = pb_grpc.AgentStub(transport.sync_channel(a.address, a.tls))
            dst = pb_grpc.AgentStub(transport.sync_channel(b.address, b.tls))
            block: dict[str, Any] = {
                "model_path": str(path),
                "layer_start": 0,
                "layer_end": cfg.num_layers,
                "device": "cpu:0",
                "stage_index": 0,
                "num_stages": 1,
                "kv_bytes": 16 << 20,
            }
            reply = src.LoadBlock(pb.LoadBlockRequest(replica_id="src", **block), timeout=600)
            source = pb.BlockSource(address=a.address, replica_id="src", stage_index=0)

            def timed(replica_id: str, **extra: Any) -> float:
                t = time.perf_counter()
                req = pb.LoadBlockRequest(replica_id=replica_id, **block, **extra)
                dst.LoadBlock(req, timeout=600)
                return time.perf_counter() - t

            cold: list[float] = []
            disk: list[float] = []
            peer: list[float] = []
            via_grpc: list[float] = []
            grpc_source = pb.BlockSource(
                address=a.address, replica_id="src", stage_index=0, transport="grpc"
            )
            for i in range(rounds):
                _evict(path)
                cold.append(timed(f"cold{i}"))
                dst.UnloadBlock(pb.UnloadBlockRequest(replica_id=f"cold{i}"))
                disk.append(timed(f"disk{i}"))
                dst.UnloadBlock(pb.UnloadBlockRequest(replica_id=f"disk{i}"))
                via_grpc.append(timed(f"grpc{i}", source=grpc_source))
                dst.UnloadBlock(pb.UnloadBlockRequest(replica_id=f"grpc{i}"))
                peer.append(timed(f"peer{i}", source=source))
                if i + 1 < rounds:
                    dst.UnloadBlock(pb.UnloadBlockRequest(replica_id=f"peer{i}"))
            prompt = [cfg.bos_token_id or 0, 5, 6, 7, 8]
            copied = local_agents.generate_tokens(dst, f"peer{rounds - 1}", prompt, 8)
            match = copied == local_agents.generate_tokens(src, "src", prompt, 8)
    nbytes = reply.block.param_bytes
    return {
        "param_bytes": nbytes,
        "load_checkpoint_cold_s": round(statistics.median(cold), 3),
        "load_checkpoint_warm_s": round(statistics.median(disk), 3),
        "load_peer_s": round(statistics.median(peer), 3),
        "peer_vs_cold": _ratio(cold, peer),
        "peer_vs_warm": _ratio(disk, peer),
        "peer_gb_s": round(nbytes / statistics.median(peer) / 1e9, 2),
        "load_peer_grpc_s": round(statistics.median(via_grpc), 3),
        "peer_gloo_gb_s": round(nbytes / statistics.median(peer) / 1e9, 2),
        "peer_grpc_gb_s": round(nbytes / statistics.median(via_grpc) / 1e9, 2),
        "gloo_vs_grpc": _ratio(via_grpc, peer),
        "tokens_match": match,
        "rounds": rounds,
        "hidden": hidden,
        "layers": args.layers,
        "transport": "gloo",  # load_peer_s; the gRPC fallback is timed beside it
        "machine": harness.machine(f"torch {torch.__version__}"),
    }
