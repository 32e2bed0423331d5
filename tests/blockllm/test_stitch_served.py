"""A stitched chain served through agents (issue 35): `tessera up` with a `stitch` variant
places the chain's two blocks (the small model's front, which applies the stitch, and the
large model's tail) by the locality-aware policy, prints where each is and the quality
measured at the point, and requests through it give the tokens of the same stitched chain
run in-process in float32 (`stitch.StitchedChain`, the oracle: it is intentionally not the
large model). The foundation (the large model) still gives `transformers`' tokens."""

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
import torch
from tokenizers import Tokenizer

from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import stitch, tiny_family
from tests.conftest import hf_greedy

pytestmark = pytest.mark.slow

MANIFEST = """apiVersion: serving.tessera.dev/v1alpha1
kind: ServingDeployment
metadata:
  name: fam
spec:
  model: {{name: tiny-large, path: {large}, dtype: float32}}
  layout:
    mode: explicit
    kvCacheBytes: 8388608
    replicas:
      - name: r0
        stages:
          - {{agent: agent-0, device: cpu:0, layers: [0, 6]}}
  variants:
    - name: fast
      stitch: {{small: {small}, point: [2, 3], zoo: {zoo}}}
"""


@pytest.fixture(scope="module")
def zoo_family(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A briefly trained family and its least-squares stitch in a zoo (the chain's tokens
    are checked against itself, so the stitch need not be good, only real)."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    out: Path = tmp_path_factory.mktemp("stitched")
    tiny_family.make_family(out, steps=10)
    auto: Any = AutoModelForCausalLM
    small = auto.from_pretrained(out / "small", dtype=torch.float32).eval()
    large = auto.from_pretrained(out / "large", dtype=torch.float32).eval()
    points = stitch.default_points(4, 6)
    st = stitch.train(
        small, large, tiny_family.sample(16, 7), points, steps_per_point=0, joint_steps=0
    )
    quality = stitch.measure(small, large, st, tiny_family.heldout(4), points)
    stitch.save(out / "zoo", out / "small", out / "large", st, quality, {})
    return out


def _post(url: str, model: str, prompt: list[int], n: int) -> tuple[int, Any]:
    body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.status, json.loads(resp.read())


def test_up_serves_a_stitched_chain_with_the_in_process_chains_tokens(
    zoo_family: Path, tmp_path: Path
) -> None:
    small, large, zoo = zoo_family / "small", zoo_family / "large", zoo_family / "zoo"
    manifest, state = tmp_path / "m.yaml", tmp_path / "state.json"
    manifest.write_text(MANIFEST.format(small=small, large=large, zoo=zoo))
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
    tok = Tokenizer.from_file(str(large / "tokenizer.json"))

    def text(ids: list[int]) -> str:
        return str(tok.decode(ids, skip_special_tokens=True))

    prompts = [tiny_family.heldout(3)[k, :20].tolist() for k in range(3)]
    chain = stitch.StitchedChain.from_zoo(zoo, small, large, (2, 3))
    try:
        url = ""
        deadline = time.monotonic() + 240
        while not url or "variant fast (stitch): Ready" not in "".join(log):
            m = re.search(r"serving .* at (http://\S+)", "".join(log))
            url = m.group(1) if m else ""
            assert up.poll() is None and time.monotonic() < deadline, "".join(log)
            time.sleep(0.3)
        out_log = " ".join("".join(log).split())  # the console wraps long lines
        # where each block is (both on agent-0, which holds the large model's layers) and
        # the quality measured at the point, as the zoo recorded it
        assert "front small[0, 2) -> stitch -> tail large[3, 6), both on agent-0" in out_log
        q = chain.quality
        assert q is not None
        assert f"top-1 agreement {round(q.top1_agreement, 4)}" in out_log, out_log

        results: dict[int, Any] = {}

        def ask(k: int) -> None:  # concurrent: the chain batches them
            results[k] = _post(url, "fast", prompts[k], 12)

        threads = [threading.Thread(target=ask, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        differ = 0
        for k, prompt in enumerate(prompts):
            status, out = results[k]
            assert status == 200, out
            want = chain.generate(prompt, 12)[0]
            assert out["choices"][0]["text"] == text(want), (k, want)
            differ += want != hf_greedy(large, prompt, 12)
        assert differ > 0  # the chain served is the stitched one, not the large model
        status, out = _post(url, "tiny-large", prompts[0], 12)
        assert out["choices"][0]["text"] == text(hf_greedy(large, prompts[0], 12))

        agent0 = json.loads(state.read_text())["agents"][0]["address"]
        stub = pb_grpc.AgentStub(transport.sync_channel(agent0, tls=None))
        d = stub.Describe(pb.DescribeRequest())
        front = next(b for b in d.blocks if b.replica_id == "default.fam.r0-fast.g1")
        assert front.model_path == str(small) and front.layer_end == 2
        assert front.stitch.next_layer_start == 3 and front.stitch.cosine == q.cosine
        tail = next(
            b for b in d.blocks if b.replica_id == "default.fam.r0-fast.g1" and b.stage_index == 1
        )
        # the tail's layers are the large model's pieces, held once in the zoo
        assert tail.shared_param_bytes == tail.param_bytes > 0
        shown = subprocess.run(
            [sys.executable, "-m", "tessera.cli.main", "status", "--state-file", str(state)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "300"},
        )
        assert shown.returncode == 0, shown.stderr
        assert f"stitch -> large from layer 3 (cosine {q.cosine:.4f}" in shown.stdout
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(60)
        reader.join(5)


def test_bench_stitch_serves_the_chain_through_an_agent(zoo_family: Path, tmp_path: Path) -> None:
    import argparse

    from tessera.cli import bench_stitch

    parser = argparse.ArgumentParser()
    bench_stitch.add_arguments(parser)
    args = parser.parse_args(
        ["--quick", "--family", str(zoo_family), "--zoo", str(tmp_path / "zoo")]
    )
    out = bench_stitch.run(args)
    served = out["served"]
    assert served["tokens_equal"] is True  # served = the same chain run in-process
    assert out["tpot_ratio"] == served["tpot_ratio"] > 0
    assert "inprocess_tpot_ratio" in out and out["cosine"] == served["stitch"]["cosine"]
    assert served["tail_shared_param_bytes"] == served["tail_param_bytes"] > 0


def test_validation_refuses_a_stitch_the_zoo_does_not_hold(zoo_family: Path) -> None:
    from types import SimpleNamespace

    from tessera import variant_spec
    from tessera.cli import variant_check

    small, large, zoo = zoo_family / "small", zoo_family / "large", zoo_family / "zoo"

    def errs(point: tuple[int, int], zoo_dir: Path, small_dir: Path = small) -> list[str]:
        v = variant_spec.VariantSpec(
            "fast", "stitch", str(small_dir), point=point, zoo=str(zoo_dir)
        )
        return variant_check.check(SimpleNamespace(spec=SimpleNamespace(variants=(v,))), str(large))

    assert errs((2, 3), zoo) == []
    assert "was not measured" in errs((2, 4), zoo)[0]
    assert "no stitch" in errs((2, 3), zoo_family)[0]
    assert "needs i below" in errs((4, 3), zoo)[0]
    assert errs((2, 3), zoo, large)[0].startswith("spec.variants[0].stitch: no stitch")
