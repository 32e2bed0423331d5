"""The served part of `tessera bench gpu`: the 1B checkpoint through `tessera up`.

`served` starts `tessera up` (one local agent on the device, one whole-model replica in
bfloat16, graphs captured at load), waits for its "serving" line, sends 64 concurrent
streaming completions of the bench's prompt / new-token lengths through the gateway
(`bench_serve._replay`) and stops it. Called by `bench_gpu.py`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from tessera_agent import random_checkpoint


def served(path: Path, device: torch.device, tiny: bool, tmp: Path) -> dict[str, Any]:
    """`tessera up` on the checkpoint (one agent, one whole-model replica), 64 concurrent
    streaming requests of the same prompt / new-token lengths as `tok_s_b64`."""
    from tessera.cli import bench_serve

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
    exe = [sys.executable, "-m", "tessera.cli.main"]
    cmd = [*exe, "up", "-f", str(tmp / "m.yaml"), "--port", "0", "--devices", devices]
    cmd += ["--agents", "1", "--state-file", str(tmp / "state.json")]
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
    }
