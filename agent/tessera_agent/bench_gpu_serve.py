"""The served part of `tessera bench gpu`: the 1B checkpoint through `tessera up`.

`served` starts `tessera up` (one local agent on the device, one whole-model replica in
bfloat16, graphs captured at load), waits for its "serving" line, sends 64 concurrent
streaming completions of the bench's prompt / new-token lengths through the gateway
(`tessera.bench.client`) and stops it. On CUDA the stage gets no fixed KV size: the agent
sizes it from its `--gpu-memory-utilization` budget, and `memory` reports the result (the
agent's Describe). Called by `bench_gpu.py`.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import torch

from tessera.bench import client, harness, local_up, trace
from tessera_agent import random_checkpoint

GPU_MEMORY_UTILIZATION = 0.9  # the agent's default, passed explicitly so the JSON says it


def served(path: Path, device: torch.device, tiny: bool, tmp: Path, tls: Any) -> dict[str, Any]:
    """`tessera up` on the checkpoint (one agent, one whole-model replica), 64 concurrent
    streaming requests of the same prompt / new-token lengths as `tok_s_b64`."""
    prompt, new = (16, 16) if tiny else (128, 128)
    layers = random_checkpoint.SHAPES["tiny" if tiny else "1b"].layers
    dev = "cpu:0" if device.type == "cpu" else "cuda:0"
    # CUDA: no kvCacheBytes, so the agent's KV pool is what its budget leaves
    # (--gpu-memory-utilization x total - in use - weights - reserve); `memory` reports it
    kv_line = "kvCacheBytes: 67108864" if device.type == "cpu" else "# kvCacheBytes: the rest"
    manifest = f"""apiVersion: serving.tessera.dev/v1alpha1
kind: ServingDeployment
metadata: {{name: gpu-check}}
spec:
  model: {{name: check, path: {path}, dtype: bfloat16}}
  layout:
    mode: explicit
    {kv_line}
    replicas:
      - name: r0
        stages:
          - {{agent: agent-0, device: {dev}, layers: [0, {layers}]}}
  gateway: {{port: 8000}}
"""
    (tmp / "m.yaml").write_text(manifest)
    devices = "cpu:1x2GiB" if device.type == "cpu" else "cuda"
    flags = ["--devices", devices, "--agents", "1"]
    flags += ["--gpu-memory-utilization", str(GPU_MEMORY_UTILIZATION)]
    with local_up.Up(tmp / "m.yaml", *flags, env={"TESSERA_COMPILE_DECODE": "0"}, what="gpu") as up:
        streams = trace.streams([(0.0, prompt, new)] * 64, random.Random(5))
        memory = _memory(up.agents()[0], tls)
        t0 = asyncio.run(client.replay(up.url, "check", streams, timeout_s=600))
    failed = [s.error or "stream ended early" for s in streams if not s.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed: {failed[:5]}")
    wall = max(s.finish for s in streams) - t0
    return {
        "tok_s": round(sum(s.usage_tokens or 0 for s in streams) / wall, 1),
        "ready_s": up.ready_s,
        "ttft_p50_ms": round(harness.pct([s.ttft or 0.0 for s in streams], 50) * 1e3, 1),
        "itl_p50_ms": round(harness.pct([g for s in streams for g in s.itl()], 50) * 1e3, 1),
        "memory": memory,
    }


def _memory(address: str, tls: Any) -> dict[str, Any]:
    """What the agent booked, from its Describe: the device budget the utilization knob
    gave, the replica's KV pool and the stage's compile / capture state."""
    from tessera.rpc import transport
    from tessera.rpc.v1 import agent_pb2 as pb
    from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

    channel = transport.sync_channel(address, tls)
    try:
        d = pb_grpc.AgentStub(channel).Describe(pb.DescribeRequest(), timeout=30)
    finally:
        channel.close()
    gib = float(1 << 30)
    return {
        "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
        "device_capacity_gib": [x.capacity_bytes / gib for x in d.devices],
        "device_free_gib": [x.free_bytes / gib for x in d.devices],
        "kv_pool_gib": sum(b.kv_bytes for b in d.blocks) / gib,
        "kv_pages": sum(b.kv_pages for b in d.blocks),
        "param_gib": sum(b.param_bytes for b in d.blocks) / gib,
        "nvml_status": d.nvml_status,
    }
