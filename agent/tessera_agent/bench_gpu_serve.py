"""The served part of `tessera bench gpu`: the 1B checkpoint through `tessera up`.

`served` starts `tessera up` (one local agent on the device, one whole-model replica in
bfloat16, graphs captured at load), waits for its "serving" line, sends 64 concurrent
streaming completions of the bench's prompt / new-token lengths through the gateway
(`tessera.bench.client`) and stops it. Called by `bench_gpu.py`.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import torch

from tessera.bench import client, harness, local_up, trace
from tessera_agent import random_checkpoint


def served(path: Path, device: torch.device, tiny: bool, tmp: Path) -> dict[str, Any]:
    """`tessera up` on the checkpoint (one agent, one whole-model replica), 64 concurrent
    streaming requests of the same prompt / new-token lengths as `tok_s_b64`."""
    prompt, new = (16, 16) if tiny else (128, 128)
    layers = random_checkpoint.SHAPES["tiny" if tiny else "1b"].layers
    dev = "cpu:0" if device.type == "cpu" else "cuda:0"
    kv = (64 << 20) if tiny else (8 << 30)
    manifest = f"""apiVersion: serving.tessera.dev/v1alpha1
kind: ServingDeployment
metadata: {{name: gpu-check}}
spec:
  model: {{name: check, path: {path}, dtype: bfloat16}}
  layout:
    mode: explicit
    kvCacheBytes: {kv}
    replicas:
      - name: r0
        stages:
          - {{agent: agent-0, device: {dev}, layers: [0, {layers}]}}
  gateway: {{port: 8000}}
"""
    (tmp / "m.yaml").write_text(manifest)
    devices = "cpu:1x2GiB" if device.type == "cpu" else "cuda"
    flags = ["--devices", devices, "--agents", "1"]
    with local_up.Up(tmp / "m.yaml", *flags, env={"TESSERA_COMPILE_DECODE": "0"}, what="gpu") as up:
        streams = trace.streams([(0.0, prompt, new)] * 64, random.Random(5))
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
    }
