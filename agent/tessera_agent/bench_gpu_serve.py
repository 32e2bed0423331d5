"""The served part of `tessera bench gpu`: the 1B checkpoint through `tessera up`.

`served` starts `tessera up` (one local agent on the device, one whole-model replica in
bfloat16, graphs captured at load), waits for its "serving" line, sends 64 concurrent
streaming completions of the bench's prompt / new-token lengths through the gateway
(`bench_serve._replay`) and stops it. On CUDA the stage gets no fixed KV size: the agent
sizes it from its `--gpu-memory-utilization` budget, and `memory` reports the result
(the agent's Describe). Called by `bench_gpu.py`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from tessera_agent import random_checkpoint

GPU_MEMORY_UTILIZATION = 0.9  # the agent's default, passed explicitly so the JSON says it


def served(path: Path, device: torch.device, tiny: bool, tmp: Path) -> dict[str, Any]:
    """`tessera up` on the checkpoint (one agent, one whole-model replica), 64 concurrent
    streaming requests of the same prompt / new-token lengths as `tok_s_b64`."""
    from tessera.cli import bench_serve

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
    exe = [sys.executable, "-m", "tessera.cli.main"]
    cmd = [*exe, "up", "-f", str(tmp / "m.yaml"), "--port", "0", "--devices", devices]
    cmd += ["--agents", "1", "--state-file", str(tmp / "state.json")]
    cmd += ["--gpu-memory-utilization", str(GPU_MEMORY_UTILIZATION)]
    env = {**os.environ, "TESSERA_COMPILE_DECODE": "0"}
    t0 = time.perf_counter()
    up = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )
    log: list[str] = []
    url = ""
    assert up.stdout is not None
    try:
        for line in up.stdout:
            log.append(line.rstrip())
            m = bench_serve._URL_RE.search(line)
            if m and "serving" in line:
                url = m.group(1)
                break
        if not url:
            raise RuntimeError("`tessera up` failed: " + " | ".join(log[-8:]))
        ready_s = time.perf_counter() - t0
        memory = _memory(tmp / "state.json")
        reqs = [(0.0, prompt, new)] * 64
        res = asyncio.run(bench_serve._replay(url, "check", reqs, seed=5))
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        try:
            up.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
    if res["failed"]:
        raise RuntimeError(f"{res['failed']} requests failed: {res['failures']}")
    return {
        "tok_s": res["throughput_tok_s"],
        "ready_s": ready_s,
        "ttft_p50_ms": res["ttft_p50_ms"],
        "itl_p50_ms": res["itl_p50_ms"],
        "memory": memory,
    }


def _memory(state_file: Path) -> dict[str, Any]:
    """What the agent booked, from its Describe: the device budget the utilization knob
    gave, the replica's KV pool and the stage's compile / capture state."""
    from tessera.rpc import transport
    from tessera.rpc.v1 import agent_pb2 as pb
    from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

    address = json.loads(state_file.read_text())["agents"][0]["address"]
    channel = transport.sync_channel(address)
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
