"""`tessera up` end to end: serves the manifest, `tessera status` shows it, and a SIGTERM or
SIGINT leaves no child process behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import hf_greedy

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> set[int]:
    """All descendants of pid (via /proc)."""
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(entry.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.add(k)
            todo.append(k)
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_up_serves_and_stops_cleanly(tiny_llama: Path, tmp_path: Path, sig: int) -> None:
    manifest = (
        (ROOT / "examples/local-tiny.yaml")
        .read_text()
        .replace("../.demo/tiny-llama", str(tiny_llama))
    )
    (tmp_path / "m.yaml").write_text(manifest)
    state = tmp_path / "state.json"
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tessera.cli.main",
            "up",
            "-f",
            str(tmp_path / "m.yaml"),
            "--port",
            "0",
            "--state-file",
            str(state),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert up.stdout is not None
    url, log = "", []
    deadline = time.monotonic() + 120
    for line in up.stdout:
        log.append(line)
        m = re.search(r"serving .* at (http://\S+)", line)
        if m:
            url = m.group(1)
            break
        assert time.monotonic() < deadline, "".join(log)
    assert url, "".join(log)
    try:
        kids = _children(up.pid)
        assert len(kids) >= 2  # the two local agents
        prompt = [0, 44, 45, 46]
        body = json.dumps(
            {
                "model": "tiny-llama",
                "prompt": prompt,
                "max_tokens": 8,
                "temperature": 0,
                "ignore_eos": True,
            }
        ).encode()
        req = urllib.request.Request(
            f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            out = json.loads(resp.read())
        assert out["usage"] == {"prompt_tokens": 4, "completion_tokens": 8, "total_tokens": 12}
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
        assert out["choices"][0]["text"] == tok.decode(hf_greedy(tiny_llama, prompt, 8))
        status = subprocess.run(
            [sys.executable, "-m", "tessera.cli.main", "status", "--state-file", str(state)],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, COLUMNS="200"),
        )
        assert status.returncode == 0, status.stderr
        assert "default.tiny.r1" in status.stdout and "[4, 8)" in status.stdout
        assert "0 hit" in status.stdout  # prefix-cache hits per replica led (none here)
    finally:
        up.send_signal(sig)
        up.wait(60)
    assert up.returncode == 0
    deadline = time.monotonic() + 10
    while any(_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [k for k in kids if _alive(k)]
    assert not state.exists()


def test_up_reports_bad_manifest(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(
        "apiVersion: serving.tessera.dev/v1alpha1\nkind: ServingDeployment\n"
        "metadata: {name: x}\nspec: {model: {name: m, path: nowhere}, gateway: {port: 0}}\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "tessera.cli.main", "up", "-f", str(tmp_path / "bad.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "spec.gateway.port" in r.stderr


def test_up_reports_a_bad_token_path_setting_before_loading(tmp_path: Path) -> None:
    (tmp_path / "ok.yaml").write_text(
        "apiVersion: serving.tessera.dev/v1alpha1\nkind: ServingDeployment\n"
        "metadata: {name: x}\nspec: {model: {name: m, path: nowhere}}\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "tessera.cli.main", "up", "-f", str(tmp_path / "ok.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TESSERA_GENERATE_MUX": "maybe"},
    )
    assert r.returncode == 1 and "TESSERA_GENERATE_MUX" in r.stderr, r.stderr


def test_up_serves_tensor_parallel_replicas(tiny_llama: Path, tmp_path: Path) -> None:
    """examples/local-tiny-tp.yaml: a tp=2 replica and a tp=2 x pp=2 replica over two
    local agents give transformers' tokens; `tessera status` shows every rank's group
    ready over gloo, and reconciling again changes nothing (no new generation)."""
    manifest = (
        (ROOT / "examples/local-tiny-tp.yaml")
        .read_text()
        .replace("../.demo/tiny-llama", str(tiny_llama))
    )
    (tmp_path / "m.yaml").write_text(manifest)
    state = tmp_path / "state.json"
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tessera.cli.main",
            "up",
            "-f",
            str(tmp_path / "m.yaml"),
            "--port",
            "0",
            "--state-file",
            str(state),
            "--reconcile-interval",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert up.stdout is not None
    url, log = "", []
    deadline = time.monotonic() + 180
    for line in up.stdout:
        log.append(line)
        m = re.search(r"serving .* at (http://\S+)", line)
        if m:
            url = m.group(1)
            break
        assert time.monotonic() < deadline, "".join(log)
    assert url, "".join(log)
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
        for prompt in ([0, 44, 45, 46], [0, 7, 300, 41, 9]):
            body = json.dumps(
                {
                    "model": "tiny-llama",
                    "prompt": prompt,
                    "max_tokens": 8,
                    "temperature": 0,
                    "ignore_eos": True,
                }
            ).encode()
            for _ in range(2):  # the gateway spreads them over both replicas
                req = urllib.request.Request(
                    f"{url}/v1/completions",
                    data=body,
                    headers={"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(req, timeout=60) as resp:
                    out = json.loads(resp.read())
                assert out["choices"][0]["text"] == tok.decode(hf_greedy(tiny_llama, prompt, 8))
        time.sleep(3)  # a few reconcile passes
        status = subprocess.run(
            [sys.executable, "-m", "tessera.cli.main", "status", "--state-file", str(state)],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, COLUMNS="250"),
        )
        assert status.returncode == 0, status.stderr
        rows = [  # the replicas table's rows (not the pipelines line under it)
            ln
            for ln in status.stdout.splitlines()
            if ln.startswith("│") and "default.tinytp." in ln and "[" in ln
        ]
        assert len(rows) == 6, status.stdout  # r0: 2 ranks; r1: 2 stages x 2 ranks
        assert all("gloo ready" in ln for ln in rows), status.stdout
        assert all(".g1 " in ln for ln in rows), status.stdout  # nothing was reloaded
        assert sum("1/2" in ln.split("│")[3] for ln in rows) == 3  # rank 1 of each stage
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(60)
    assert up.returncode == 0
