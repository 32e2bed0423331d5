"""`tessera up` resizes an auto layout as the operator does (issue 32).

`tessera up` with two local agents (no host cache), `layout: auto` (one replica per
agent), `spec.scaling` min 1 max 2 and a 1 ms TTFT SLO, and a reconcile interval of an
hour, so only the autoscaler's own trigger runs a converge pass. Calm, with no host cache
to sleep in, the plan shrinks to one replica (its blocks unloaded); load grows it back to
two (the new replica loaded from the peer, not from storage); calm shrinks it again.
Every request sent meanwhile returns transformers' greedy text.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from tessera.control import agents
from tests.conftest import hf_greedy
from tests.operator.test_operator_autoscale import NEW, PROMPT, _burst

pytestmark = pytest.mark.slow

MANIFEST = """
apiVersion: serving.tessera.dev/v1alpha1
kind: ServingDeployment
metadata: {{name: grow, namespace: default}}
spec:
  model: {{name: tiny-llama, path: {model}}}
  layout: {{mode: auto, kvCacheBytes: 16777216}}
  gateway: {{port: 8000}}
  slo: {{ttftP99Ms: 1}}
  scaling:
    enabled: true
    replicas: {{min: 1, max: 2}}
    signals: {{scaleDownAfterSeconds: 2, upCooldownSeconds: 1}}
"""


def _wait(what: str, check: Callable[[], Any], log: list[str], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}:\n{''.join(log[-60:])}")


def _held(refs: list[agents.AgentRef]) -> dict[str, dict[str, int]]:
    """Replica id -> its blocks' bytes by source, over every agent."""
    obs = asyncio.run(agents.observe(refs, tls=None))
    out: dict[str, dict[str, int]] = {}
    for a in obs.agents:
        for b in a.blocks:
            out.setdefault(b.replica_id, {})
        for ld in a.loads:
            per = out.setdefault(ld.replica_id, {})
            for src, n in (("peer", ld.peer_bytes), ("host", ld.host_bytes)):
                per[src] = per.get(src, 0) + n
            per["storage"] = per.get("storage", 0) + ld.storage_bytes
    return out


def test_up_grows_on_load_and_shrinks_when_calm(tiny_llama: Path, tmp_path: Path) -> None:
    tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
    want = tok.decode(hf_greedy(tiny_llama, PROMPT, NEW), skip_special_tokens=True)
    (tmp_path / "m.yaml").write_text(MANIFEST.format(model=tiny_llama))
    state = tmp_path / "state.json"
    cmd = [sys.executable, "-m", "tessera.cli.main", "up", "-f", str(tmp_path / "m.yaml"),
           "--port", "0", "--state-file", str(state), "--agents", "2", "--threads", "1",
           "--devices", "cpu:1x512MiB", "--reconcile-interval", "3600"]  # fmt: skip
    up = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, COLUMNS="400"),
    )  # fmt: skip
    assert up.stdout is not None
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(up.stdout or []), daemon=True).start()
    try:
        url = _wait("serving", lambda: _url(log), log)
        refs = [
            agents.AgentRef(a["name"], a["address"])
            for a in json.loads(state.read_text())["agents"]
        ]
        assert len(_held(refs)) == 2
        # calm, no host cache: the plan shrinks to one replica, the other's blocks unloaded
        _wait("the plan shrunk to 1", lambda: len(_held(refs)) == 1, log, 90)
        assert any("ReplicasResized" in line and "plan 2 -> 1" in line for line in log)
        kept = next(iter(_held(refs)))
        assert asyncio.run(_burst(url, 2)) == [(200, want)] * 2

        # load: TTFT over the SLO -> the plan grows back to 2, the new replica from the peer
        got: list[tuple[int, str]] = []
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                got.extend(asyncio.run(_burst(url, 4)))

        t = threading.Thread(target=load, daemon=True)
        t.start()
        try:
            held = _wait("the plan grown to 2", lambda: len(_held(refs)) == 2 and _held(refs), log)
        finally:
            stop.set()
            t.join(120)
        added = next(r for r in held if r != kept)
        assert any("ReplicasResized" in line and "plan 1 -> 2" in line for line in log)
        assert held[added].get("peer", 0) > 0 and held[added]["storage"] == 0, held
        assert got and got == [(200, want)] * len(got), got[:3]

        # calm again: removed, and the one left still serves
        _wait("the plan shrunk again", lambda: len(_held(refs)) == 1, log, 90)
        assert asyncio.run(_burst(url, 2)) == [(200, want)] * 2
    finally:
        up.terminate()
        up.wait(60)


def _url(log: list[str]) -> str:
    for line in log:
        if "serving" in line and " at http://" in line:
            return line.rsplit(" at ", 1)[1].strip()
    return ""
