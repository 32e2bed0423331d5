"""`tessera agent`: run one node agent (gRPC server hosting the block engine)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("agent", help="run a node agent (gRPC)")
    p.add_argument("--agent-id", default=socket.gethostname())
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50051, help="0 picks a free port")
    p.add_argument(
        "--devices",
        default="auto",
        help="cpu:2x4GiB (declared CPU virtual devices), cuda (all GPUs), cuda:N, "
        "or auto (GPUs via NVML, else one 4GiB CPU device)",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="fraction of each GPU's memory this agent may use (as vLLM's): blocks book "
        "against fraction x total less what is in use at start; a block's KV pool is what "
        "its parameters and activation / CUDA-graph reserve leave (default 0.9)",
    )
    p.add_argument(
        "--attention-backend",
        default=os.environ.get("TESSERA_ATTENTION_BACKEND", "auto"),
        help="auto, native, flex or flashinfer: the kernels stages attend over the paged KV "
        "pool with (auto: native, the engine's own paths, until a GPU run of `tessera bench "
        "gpu` measures a better one; flashinfer needs the `gpu` extra). docs/gpu.md "
        "(default: $TESSERA_ATTENTION_BACKEND, else auto)",
    )
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: default)")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve Prometheus /metrics on this port (0: off)",
    )
    p.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help="do not reuse the KV pages of prompt prefixes already computed",
    )
    p.add_argument(
        "--no-block-zoo",
        dest="block_zoo",
        action="store_false",
        help="load every block's parameters, even when identical ones are held (baselines)",
    )
    p.add_argument(
        "--no-cobatch",
        dest="cobatch",
        action="store_false",
        help="run every chain's step alone, even when chains share blocks (A/B baselines)",
    )
    p.add_argument(
        "--cobatch-rows",
        type=int,
        default=0,
        help="batch limit of a shared block instance, in token rows per pass (0: 8192)",
    )
    p.add_argument(
        "--cobatch-linger-ms",
        type=float,
        default=-1.0,
        help="after a co-step, wait up to this long for its chains' next steps (-1: 2 ms)",
    )
    p.add_argument(
        "--pipeline-microbatches",
        type=int,
        default=0,
        help="microbatches a pipelined replica led here keeps in flight (0: one per stage; "
        "for a pipeline an overload drop made of CPU stages linked over loopback, one)",
    )
    p.add_argument(
        "--health-port",
        type=int,
        default=0,
        help="also serve grpc.health.v1 alone, plaintext, on this port (kubelet probes; 0: off)",
    )
    p.add_argument(
        "--model-root",
        default=os.environ.get("TESSERA_MODEL_ROOT", ""),
        help="refuse loads of checkpoints outside this folder (default: $TESSERA_MODEL_ROOT; "
        "unset: anywhere). mTLS is on when $TESSERA_TLS_DIR names ca.crt, tls.crt, tls.key",
    )
    p.add_argument(
        "--storage-bandwidth",
        type=float,
        default=float(os.environ.get("TESSERA_STORAGE_BYTES_PER_S", "0") or 0),
        help="checkpoint reads take at least bytes / this many bytes per second, as from a "
        "cluster's network storage (default: $TESSERA_STORAGE_BYTES_PER_S; 0: unthrottled)",
    )
    p.add_argument(  # tests: an operator killed while a replication is in flight
        "--run-load-delay", type=float, default=0.0, help=argparse.SUPPRESS
    )
    p.add_argument(
        "--host-cache",
        default=os.environ.get("TESSERA_HOST_CACHE", "0"),
        metavar="BYTES",
        help="host memory kept for the pieces of unloaded blocks, e.g. 8GiB: a reload or a "
        "variant sharing them takes them from there (pinned on GPUs; default: "
        "$TESSERA_HOST_CACHE; 0: no host cache). docs/scaling.md",
    )
    p.add_argument(
        "--cost-profile",
        default=os.environ.get("TESSERA_COST_PROFILE", ""),
        help="a `tessera profile --out` JSON: the cost model of lookahead microbatching on "
        "pipelines made by an overload drop (default: $TESSERA_COST_PROFILE; unset: a "
        "documented default)",
    )
    p.add_argument(
        "--no-compile-decode",
        dest="compile_decode",
        action="store_false",
        help="run decode steps eagerly (default on CPU: compiled with torch.compile, warmed "
        "up after each load before the load answers; TESSERA_COMPILE_DECODE=0 also turns it "
        "off, =background answers at once and warms up behind)",
    )
    p.add_argument(
        "--compile-cache",
        default="",
        metavar="DIR",
        help="folder of the compiled graphs cached across restarts, one subfolder per torch "
        "version (default: $TESSERA_COMPILE_CACHE, else $XDG_CACHE_HOME/tessera/compile)",
    )
    p.set_defaults(func=_run)


# Set by the process that started this agent (cli/local_agents.py): its pid. The agent asks
# Linux to SIGTERM it when that parent dies, even by SIGKILL, so no agent outlives `tessera up`
# or a test. Done here, after exec, rather than in a `preexec_fn`: a preexec_fn forces a full
# fork, whose gRPC fork handlers can crash the child before it execs ("epoll_wait error: Bad
# file descriptor", grpc/grpc#43055) when the parent already runs gRPC.
PARENT_PID_ENV = "TESSERA_PARENT_PID"


def _die_with_parent() -> None:
    want = os.environ.get(PARENT_PID_ENV, "")
    if not want.isdigit() or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != int(want):  # the parent died before the prctl took effect
        raise SystemExit(f"tessera agent: parent {want} is gone")


def _host_cache_bytes(text: str) -> int:
    from tessera_agent import devices

    return 0 if text.strip() in ("", "0") else devices.parse_bytes(text)


def _run(args: argparse.Namespace) -> int:
    _die_with_parent()
    from tessera.observability import tracing

    tracing.configure(os.environ)
    from tessera import gc_heap
    from tessera.rpc import transport
    from tessera_agent import server
    from tessera_agent.engine import compile_cache, compile_policy, options

    try:
        engine = dataclasses.replace(
            options.EngineOptions.from_env(os.environ, compile_default=args.compile_decode),
            attention_backend=args.attention_backend,
        )
        tls = transport.tls_from_dir(os.environ.get(transport.TLS_DIR_ENV, ""))
    except (ValueError, FileNotFoundError) as exc:
        sys.stderr.write(f"tessera agent: {exc}\n")
        return 2
    if compile_policy.enabled(engine):  # before anything compiles
        compile_cache.configure(args.compile_cache or None, os.environ)
        compile_cache.prepare()  # overlaps the wait for the first load
    cfg = server.AgentConfig(
        agent_id=args.agent_id,
        host=args.host,
        port=args.port,
        devices=args.devices,
        gpu_memory_utilization=args.gpu_memory_utilization,
        threads=args.threads,
        metrics_port=args.metrics_port,
        prefix_caching=args.prefix_caching,
        model_root=args.model_root,
        health_port=args.health_port,
        block_zoo=args.block_zoo,
        cobatch=args.cobatch,
        cobatch_rows=args.cobatch_rows,
        cobatch_linger_s=args.cobatch_linger_ms / 1000 if args.cobatch_linger_ms >= 0 else -1.0,
        pipeline_microbatches=args.pipeline_microbatches,
        storage_bytes_per_s=args.storage_bandwidth,
        run_load_delay_s=args.run_load_delay,
        host_cache_bytes=_host_cache_bytes(args.host_cache),
        cost_profile=args.cost_profile,
        engine=engine,
        gc_freeze=gc_heap.wanted(os.environ),
        slow_block=os.environ.get("TESSERA_BENCH_SLOW_BLOCK", ""),
        tls=tls,
    )
    return server.run(cfg)
