"""Agent process entry point: serves the Agent and grpc.health.v1 services until signalled.

Called by `tessera agent` (and by `tessera up`, which starts one process per local
agent). Prints one line `tessera-agent <id> listening on <host>:<port>` once serving, so
parents can wait for readiness; SIGTERM/SIGINT stop it gracefully.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tessera import event_loop, gc_heap
from tessera.cost import profile as profile_mod
from tessera.policies.overload import microbatch
from tessera.policies.serving import block_batching, gpu_memory
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import authz, devices, load_config, servicer
from tessera_agent.engine import (
    decode_graph,
    host_malloc,
    omp_teams,
    options,
)
from tessera_agent.transfer import store

VERSION = "0.1.0"
SERVICE_NAME = "tessera.rpc.v1.Agent"


@dataclass(frozen=True)
class AgentConfig:
    agent_id: str = "agent-0"
    host: str = "127.0.0.1"
    port: int = 50051  # 0 = pick a free port
    devices: str = "cpu:1x4GiB"
    gpu_memory_utilization: float = gpu_memory.DEFAULT_UTILIZATION  # of each GPU's total
    threads: int = 0  # torch intra-op threads; 0 = torch's default
    metrics_port: int = 0  # Prometheus /metrics port; 0 = off
    prefix_caching: bool = True  # replicas led here reuse KV pages of computed prefixes
    model_root: str = ""  # loads must name a checkpoint under this folder; "" = anywhere
    health_port: int = 0  # plaintext grpc.health.v1 only (kubelet probes speak no mTLS); 0 = off
    block_zoo: bool = True  # share identical parameter pieces between blocks (issue 14)
    pipeline_microbatches: int = 0  # in flight per pipelined replica led here; 0 = its stages
    storage_bytes_per_s: float = 0.0  # declared checkpoint read speed (issue 11); 0 = as is
    run_load_delay_s: float = 0.0  # tests: a layer-run replica's load answers no sooner
    host_cache_bytes: int = 0  # host block cache budget (issue 32); 0 = none
    cost_profile: str = ""  # `tessera profile --out` JSON: lookahead's Eq. 1 (issue 13)
    cobatch: bool = True  # co-batch steps of chains sharing blocks (issue 14, cobatch.py)
    cobatch_rows: int = 0  # rows per pass of a shared block instance; 0 = the default
    cobatch_linger_s: float = -1.0  # wait for a co-step's chains to resubmit; < 0 = default
    # engine switches from the entry point's environment (`EngineOptions.from_env`)
    engine: options.EngineOptions = field(default_factory=options.EngineOptions)
    slow_block: str = ""  # benches: $TESSERA_BENCH_SLOW_BLOCK (speculate_serve.slow_s)
    gc_freeze: bool = True  # settle the cycle collector at loads (gc_heap; $TESSERA_GC_FREEZE)
    tls: transport.TlsFiles | None = None  # mTLS files ($TESSERA_TLS_DIR); None = plaintext

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port: {self.port} is not a TCP port")
        if not 0 <= self.health_port < 65536:
            raise ValueError(f"health_port: {self.health_port} is not a TCP port")
        if not 0 <= self.metrics_port < 65536:
            raise ValueError(f"metrics_port: {self.metrics_port} is not a TCP port")
        if self.threads < 0:
            raise ValueError("threads: must be >= 0")
        if self.cobatch_rows < 0:
            raise ValueError("cobatch_rows: must be >= 0")
        gpu_memory.check_utilization(self.gpu_memory_utilization)


def split_config(cost_profile: str) -> microbatch.SplitConfig:
    """Lookahead's cost model from a `tessera profile` output (per layer: only the
    coefficients' ratios steer the split), or the documented default without one."""
    if not cost_profile:
        return microbatch.SplitConfig()
    try:
        doc = json.loads(Path(cost_profile).read_text())
        prof = profile_mod.profile_from_json(doc)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cost_profile: cannot read {cost_profile!r}: {exc}") from exc
    return microbatch.SplitConfig(cost=microbatch.chunk_cost(prof, 1))


def cobatch_limits(cfg: AgentConfig) -> block_batching.BatchLimits | None:
    """Per-block batch limits of the compute thread; None = no co-batching."""
    if not cfg.cobatch:
        return None
    rows = cfg.cobatch_rows or block_batching.DEFAULT_ROWS_PER_PASS
    linger = cfg.cobatch_linger_s if cfg.cobatch_linger_s >= 0 else block_batching.DEFAULT_LINGER_S
    return block_batching.BatchLimits(rows_per_pass=rows, linger_s=linger)


async def serve(cfg: AgentConfig) -> None:
    devs, nvml_status = devices.parse_devices(cfg.devices, cfg.gpu_memory_utilization)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    host_malloc.tune(cfg.engine.malloc_tune)  # step temporaries stay in the heap
    # Work handed to the loop's default executor (reads, copies) must not leave an OpenMP
    # team behind: the compute thread's team would stop spinning (see omp_teams).
    release = cfg.engine.omp_release
    asyncio.get_running_loop().set_default_executor(omp_teams.ReleasingPool(release=release))
    if release:
        omp_teams.release()  # a team this thread may have built while starting up
    tls = cfg.tls
    server = transport.server(
        (authz.Authorizer(tls=tls is not None, model_root=cfg.model_root or None),)
    )
    defaults = load_config.LoadDefaults(
        prefix_caching=cfg.prefix_caching,
        pipeline_microbatches=cfg.pipeline_microbatches,
        storage_bytes_per_s=cfg.storage_bytes_per_s,
        run_load_delay_s=cfg.run_load_delay_s,
        host_cache_bytes=cfg.host_cache_bytes,
        microbatch_split=split_config(cfg.cost_profile),
        block_zoo=cfg.block_zoo,
        engine=cfg.engine,
        gc_settle=cfg.gc_freeze,  # this process owns its heap: freeze it at loads
        slow_block=cfg.slow_block,
        tls=tls,
    )
    rendezvous = store.serve(cfg.host)  # data-plane groups of replicas hosted here meet on it
    svc = servicer.AgentServicer(
        cfg.agent_id,
        devs,
        nvml_status,
        VERSION,
        defaults=defaults,
        store_address=f"{cfg.host}:{rendezvous.port}",
        cobatch=cobatch_limits(cfg),
    )
    pb_grpc.add_AgentServicer_to_server(svc, server)
    health_svc = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_svc, server)
    port = transport.add_port(server, f"{cfg.host}:{cfg.port}", tls)
    if tls is None:
        loopback = cfg.host in ("127.0.0.1", "localhost", "::1")
        logging.getLogger(__name__).log(
            logging.INFO if loopback else logging.WARNING,
            "plaintext gRPC on %s: anyone who reaches this port is trusted (set %s for mTLS)",
            cfg.host,
            transport.TLS_DIR_ENV,
        )
    probes = None
    if cfg.health_port:
        # Health only: it reveals serving state, nothing else, and kubelet cannot do mTLS.
        probes = transport.server()
        health_pb2_grpc.add_HealthServicer_to_server(health_svc, probes)
        transport.add_port(probes, f"{cfg.host}:{cfg.health_port}", None)
        await probes.start()
    if cfg.metrics_port:
        svc.metrics.serve(cfg.host, cfg.metrics_port)
    await server.start()
    if cfg.gc_freeze:
        gc_heap.settle("agent started")  # the imports' objects: later passes skip them
    for name in ("", SERVICE_NAME):
        await health_svc.set(name, health_pb2.HealthCheckResponse.SERVING)
    mode = "mtls" if tls else "plaintext"
    sys.stdout.write(f"tessera-agent {cfg.agent_id} listening on {cfg.host}:{port} ({mode})\n")
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    waiter = asyncio.create_task(server.wait_for_termination())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    for name in ("", SERVICE_NAME):
        await health_svc.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await svc.close()
    await server.stop(grace=1.0)
    if probes is not None:
        await probes.stop(grace=None)
    waiter.cancel()
    stopper.cancel()


def run(cfg: AgentConfig) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        event_loop.run(serve(cfg))
    except devices.DeviceError as exc:
        sys.stderr.write(f"tessera agent: {exc}\n")
        return 2
    if decode_graph.warming():  # a compile thread cannot be stopped; exiting under it aborts
        logging.getLogger(__name__).info("stopped during a decode warm-up: exiting at once")
        logging.shutdown()
        sys.stdout.flush()
        os._exit(0)
    return 0
