"""Speculation on the served path (issue 35): `tessera up` with 2 agents and three
`speculate` variants of the same bottleneck block, whose surrogates (the paper's pseudo
surrogates: the block's copy) are right, wrong, and half right on purpose. The foundation
is pipelined [0, 2) on agent-0, [2, 4) on agent-1; each variant's chain is cut
[0, 1) [1, 2) [2, 4) beside it, so the speculated block's guess goes over the stage stream
to the other agent. Concurrent requests through every variant give `transformers`' greedy
tokens (float32), and the status shows each chain's hits and misses: all hits, all
misses, and both (with steps where some sequences hit and others missed)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import surrogate_zoo
from tests.conftest import hf_greedy

pytestmark = pytest.mark.slow

MANIFEST = """apiVersion: serving.tessera.dev/v1alpha1
kind: ServingDeployment
metadata:
  name: sp
spec:
  model: {{name: tiny, path: {model}, dtype: float32}}
  layout:
    mode: explicit
    kvCacheBytes: 4194304
    replicas:
      - name: r0
        stages:
          - {{agent: agent-0, device: cpu:0, layers: [0, 2]}}
          - {{agent: agent-1, device: cpu:0, layers: [2, 4]}}
  variants:
    - {{name: right, speculate: {{layers: [1, 2], zoo: {zoo}/right}}}}
    - {{name: wrong, speculate: {{layers: [1, 2], zoo: {zoo}/wrong}}}}
    - {{name: half, speculate: {{layers: [1, 2], zoo: {zoo}/half}}}}
"""
WRONG = {"right": "never", "wrong": "always", "half": "half"}


def _post(url: str, model: str, prompt: list[int], n: int) -> tuple[int, Any]:
    body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.status, json.loads(resp.read())


def test_up_serves_speculated_chains_with_transformers_tokens(tmp_path: Path) -> None:
    from tessera_agent import tiny_checkpoint as tc

    model = tc.make_tiny(
        tmp_path / "tiny", tc.TinySpec(layers=4, hidden=64, heads=4, kv_heads=2, vocab=512)
    )
    zoo = tmp_path / "zoo"
    for name, wrong in WRONG.items():
        surrogate_zoo.save_pseudo(zoo / name, model, (1, 2), wrong)
    manifest, state = tmp_path / "m.yaml", tmp_path / "state.json"
    manifest.write_text(MANIFEST.format(model=model, zoo=zoo))
    up = subprocess.Popen(
        [
            *(sys.executable, "-m", "tessera.cli.main", "up", "-f", str(manifest)),
            *("--agents", "2", "--port", "0", "--state-file", str(state)),
            *("--watch-interval", "0.3", "--reconcile-interval", "2"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert up.stdout is not None
    log: list[str] = []
    reader = threading.Thread(target=lambda: log.extend(up.stdout or []), daemon=True)
    reader.start()
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))

    def text(ids: list[int]) -> str:
        return str(tok.decode(ids, skip_special_tokens=True))

    # distinct prompts of different lengths (no shared prefix pages), BOS first
    prompts = [[0, *range(5 + 40 * k, 5 + 40 * k + n)] for k, n in enumerate((3, 21, 9, 34))]
    n_new = 10
    try:
        url = ""
        deadline = time.monotonic() + 300
        while not url or any(f"variant {v} (speculate): Ready" not in "".join(log) for v in WRONG):
            m = re.search(r"serving .* at (http://\S+)", "".join(log))
            url = m.group(1) if m else ""
            assert up.poll() is None and time.monotonic() < deadline, "".join(log)
            time.sleep(0.3)
        out_log = " ".join("".join(log).split())
        assert (
            "default.sp.r0-right.g1: [0, 1) on agent-0 -> [1, 2) (speculated) on agent-0 -> "
            "[2, 4) on agent-1; the stage after it on another agent" in out_log
        ), out_log

        results: dict[tuple[str, int], Any] = {}

        def ask(v: str, k: int) -> None:  # concurrent: each chain batches its requests
            results[(v, k)] = _post(url, v, prompts[k], n_new)

        threads = [
            threading.Thread(target=ask, args=(v, k)) for v in (*WRONG, "tiny") for k in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        for k, prompt in enumerate(prompts):
            want = text(hf_greedy(model, prompt, n_new))
            for v in (*WRONG, "tiny"):
                status, out = results[(v, k)]
                assert status == 200, out
                assert out["choices"][0]["text"] == want, (v, k)

        agent0 = json.loads(state.read_text())["agents"][0]["address"]
        stub = pb_grpc.AgentStub(transport.sync_channel(agent0, tls=None))
        d = stub.Describe(pb.DescribeRequest())
        got = {
            b.replica_id: b.speculate
            for b in d.blocks
            if b.HasField("speculate") and b.stage_index == 1
        }
        right, wrong, half = (got[f"default.sp.r0-{v}.g1"] for v in WRONG)
        assert right.kind == "pseudo" and right.speculated_steps > 0
        assert right.hits > 0 and right.misses == 0  # every guess kept
        assert wrong.hits == 0 and wrong.misses > 0  # every guess recomputed
        assert half.hits > 0 and half.misses > 0  # both, some steps mixed
        assert half.mixed_steps > 0

        # the status line shows the hit rate (`tessera up` prints each variant's line)
        deadline = time.monotonic() + 30
        while "hit rate 1.0 (" not in " ".join("".join(log).split()):
            assert time.monotonic() < deadline, "".join(log)
            time.sleep(0.3)
        shown = subprocess.run(
            [sys.executable, "-m", "tessera.cli.main", "status", "--state-file", str(state)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "300"},
        )
        assert shown.returncode == 0, shown.stderr
        assert "speculated (pseudo surrogate)" in shown.stdout
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(60)
        reader.join(5)


def test_bench_speculate_served_row() -> None:
    """`tessera bench speculate --quick`'s `served` row: two agent processes, the bottleneck
    slowed on purpose; tokens equal `off` (= transformers) on every run, and the hit rates
    the surrogates were made to have."""
    import argparse

    from tessera.cli import bench_speculate

    parser = argparse.ArgumentParser()
    bench_speculate.add_arguments(parser)
    args = parser.parse_args(["--quick", "--bottleneck-ms", "20", "--hop-ms", "1"])
    served = bench_speculate.run(args)["served"]
    runs = served["runs"]
    assert runs["off"]["tokens_equal_transformers"]
    for name in ("lowrank", "pseudo", "pseudo_half"):
        assert runs[name]["tokens_equal"], name
        assert runs[name]["speculated_steps"] > 0 and runs[name]["latency_ratio"] > 0
    assert runs["pseudo"]["hit_rate"] == 1.0 and runs["pseudo_half"]["hit_rate"] == 0.5
    assert served["agents"] == ["A", "A", "B"]
    assert served["hit_rate"] == runs["lowrank"]["hit_rate"]
