"""`tessera up` with variants: declared in the manifest, served by the OpenAI `model` field,
and added/removed at run time by editing the manifest, without reloading the foundation
(its replica id and its leader's prefix-cache counters survive the edit). Each variant's
state is printed as it changes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import tiny_variants
from tests.conftest import hf_greedy
from tests.variants.test_variants_gateway import _peft_greedy

pytestmark = pytest.mark.slow
peft = pytest.importorskip("peft", reason="peft is the LoRA oracle (dev extra)")

MANIFEST = """apiVersion: serving.tessera.dev/v1alpha1
kind: ServingDeployment
metadata:
  name: tiny
spec:
  model: {{name: tiny-llama, path: {model}, dtype: float32}}
  layout:
    mode: explicit
    kvCacheBytes: 8388608
    replicas:
      - name: r0
        stages:
          - {{agent: agent-0, device: cpu:0, layers: [0, 8]}}
  variants:
{variants}
"""
PROMPT = list(range(20, 44))  # 24 tokens: one full KV page of 16 can be cached


def _write(path: Path, model: Path, variants: list[dict[str, str]]) -> None:
    lines = "\n".join("    - " + json.dumps(v) for v in variants)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(MANIFEST.format(model=model, variants=lines))
    tmp.replace(path)  # atomic, as an editor saves


def _post(url: str, model: str, prompt: list[int], n: int = 8) -> tuple[int, Any]:
    body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0}
    req = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps({**body, "ignore_eos": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _models(url: str) -> list[str]:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as resp:
        return [m["id"] for m in json.loads(resp.read())["data"]]


def test_up_adds_and_removes_variants_without_reloading_the_foundation(
    tiny_llama: Path, tmp_path: Path
) -> None:
    made = {
        "legal": tiny_variants.make_tiny_lora(tiny_llama, tmp_path / "legal", r=4, seed=21),
        "code": tiny_variants.make_tiny_lora(tiny_llama, tmp_path / "code", r=2, seed=22),
        "med": tiny_variants.make_tiny_finetune(
            tiny_llama, tmp_path / "med", layers=(3,), seed=23, std=0.05
        ),
    }
    manifest, state = tmp_path / "m.yaml", tmp_path / "state.json"
    _write(manifest, tiny_llama, [{"name": "legal", "adapter": str(made["legal"])}])
    up = subprocess.Popen(
        [
            *(sys.executable, "-m", "tessera.cli.main", "up", "-f", str(manifest)),
            *("--agents", "1", "--port", "0", "--state-file", str(state)),
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
    tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))

    def text(ids: list[int]) -> str:
        return str(tok.decode(ids, skip_special_tokens=True))

    try:
        url = ""
        deadline = time.monotonic() + 180
        while not url:
            m = re.search(r"serving .* at (http://\S+)", "".join(log))
            url = m.group(1) if m else ""
            assert up.poll() is None and time.monotonic() < deadline, "".join(log)
            time.sleep(0.2)
        assert _models(url) == ["tiny-llama", "legal"]
        st, out = _post(url, "legal", PROMPT)
        assert st == 200, out
        assert out["choices"][0]["text"] == text(
            _peft_greedy(str(tiny_llama), str(made["legal"]), tuple(PROMPT), 8)
        )
        for _ in range(2):  # the second one hits the prefix cache
            st, out = _post(url, "tiny-llama", PROMPT)
            assert out["choices"][0]["text"] == text(hf_greedy(tiny_llama, PROMPT, 8))
        agent = json.loads(state.read_text())["agents"][0]["address"]
        stub = pb_grpc.AgentStub(transport.sync_channel(agent, tls=None))
        before = {k.replica_id: k.prefix_hit_tokens for k in stub.Describe(pb.DescribeRequest()).kv}
        assert list(before) == ["default.tiny.r0.g1"] and before["default.tiny.r0.g1"] >= 16

        # edit: remove legal, add a LoRA and a full fine-tune
        _write(
            manifest,
            tiny_llama,
            [
                {"name": "code", "adapter": str(made["code"])},
                {"name": "med", "checkpoint": str(made["med"])},
            ],
        )
        deadline = time.monotonic() + 180
        while _models(url) != ["tiny-llama", "code", "med"]:
            assert up.poll() is None and time.monotonic() < deadline, "".join(log)
            time.sleep(0.3)
        st, out = _post(url, "med", PROMPT)
        assert st == 200 and out["choices"][0]["text"] == text(hf_greedy(made["med"], PROMPT, 8))
        st, out = _post(url, "code", PROMPT)
        assert out["choices"][0]["text"] == text(
            _peft_greedy(str(tiny_llama), str(made["code"]), tuple(PROMPT), 8)
        )
        st, err = _post(url, "legal", PROMPT)
        assert st == 404 and "`med`" in err["error"]["message"]
        d = stub.Describe(pb.DescribeRequest())
        after = {k.replica_id: k.prefix_hit_tokens for k in d.kv}
        # the foundation's replica was not reloaded: same id, same engine (its counters)
        assert after["default.tiny.r0.g1"] >= before["default.tiny.r0.g1"]
        assert "default.tiny.r0-med.g1" in after
        one = next(b for b in d.blocks if b.replica_id == "default.tiny.r0.g1")
        assert list(one.variants) == ["code"]
        med = next(b for b in d.blocks if b.replica_id == "default.tiny.r0-med.g1")
        assert med.shared_param_bytes > 0.8 * med.param_bytes  # 7 of 8 layers + ends shared
        status = subprocess.run(
            [sys.executable, "-m", "tessera.cli.main", "status", "--state-file", str(state)],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, COLUMNS="250"),
        )
        assert status.returncode == 0, status.stderr
        assert "code" in status.stdout and "block zoo" in status.stdout
        deadline = time.monotonic() + 30
        while "variant legal: removed" not in "".join(log) and time.monotonic() < deadline:
            time.sleep(0.2)
        out_log = "".join(log)
        assert "variant med (full): Ready" in out_log and "variant legal: removed" in out_log
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(60)
        reader.join(5)
