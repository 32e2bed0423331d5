"""Against a live `tessera up`: every dashboard query names metrics (and labels) the gateway
and the agents export, and the status page, rendered in headless Chromium during a
relayout, shows every replica and stage.

Two agents (started here with a Prometheus port) serve two whole replicas; the manifest is
then rewritten to one whole replica plus a two-stage pipeline (`bench_relayout.LAYOUTS`),
which `tessera up` carries out as a transition. Screenshots go to $TESSERA_ARTIFACTS_DIR
(default: the test's tmp dir), never into the repository.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tessera.cli import bench_relayout, local_agents
from tessera.observability import control, dashboards
from tests.observability import promql

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # serial: two agents + tessera up, both cores
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), "")


@dataclass
class Live:
    url: str
    agent_metrics: list[str]  # http://host:port/metrics of each agent
    manifest: Path
    model: Path
    log: list[str]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 30) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return str(r.read().decode())


def _complete(url: str, max_tokens: int = 6) -> None:
    body = json.dumps(
        {"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": max_tokens}
    ).encode()
    req = urllib.request.Request(
        f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200


def _status(url: str) -> dict[str, Any]:
    return dict(json.loads(_get(f"{url}/admin/v1/status")))


def _stages(status: dict[str, Any]) -> set[tuple[str, int, str]]:
    return {(s["replica"], s["stage"], a["name"]) for a in status["agents"] for s in a["stages"]}


@pytest.fixture(scope="module")
def live(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("live-up")
    ports = [_free_port(), _free_port()]
    agents = [
        local_agents.start_agent(
            f"agent-{i}", "cpu:1x2GiB", 1, extra_args=["--metrics-port", str(ports[i])]
        )
        for i in range(2)
    ]
    manifest = tmp / "m.yaml"
    bench_relayout.write_manifest(manifest, tiny_llama, 0)
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tessera.cli.main",
            "up",
            "-f",
            str(manifest),
            "--port",
            "0",
            "--state-file",
            str(tmp / "state.json"),
            "--watch-interval",
            "0.2",
            "--drain-deadline",
            "0.5",
            *(f"--agent=agent-{i}={a.address}" for i, a in enumerate(agents)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    log: list[str] = []
    url = ""
    try:
        assert up.stdout is not None
        deadline = time.monotonic() + 180
        for line in up.stdout:
            log.append(line.rstrip())
            m = re.search(r"serving .* at (http://\S+)", line)
            if m:
                url = m.group(1)
                break
            assert time.monotonic() < deadline, "\n".join(log)
        assert url, "\n".join(log)
        out = up.stdout
        threading.Thread(target=lambda: [log.append(x.rstrip()) for x in out], daemon=True).start()
        yield Live(url, [f"http://127.0.0.1:{p}/metrics" for p in ports], manifest, tiny_llama, log)
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        up.wait(30)
        for a in agents:
            local_agents.stop_agent(a)


def _relayout(live: Live, layout: int, shots: list[Path], shoot: Any) -> dict[str, Any]:
    """Rewrite the manifest to LAYOUTS[layout]; poll (and shoot) until the status shows it."""
    want = {
        (s["agent"], tuple(s["layers"]))
        for r in bench_relayout.LAYOUTS[layout][1]
        for s in r["stages"]
    }
    bench_relayout.write_manifest(live.manifest, live.model, layout)
    deadline = time.monotonic() + 180
    while True:
        if shoot is not None:
            shots.append(shoot(len(shots)))
        st = _status(live.url)
        have = {(a["name"], tuple(s["layers"])) for a in st["agents"] for s in a["stages"]}
        if have == want and not st["leaving"]:
            return st
        assert time.monotonic() < deadline, (st, "\n".join(live.log[-40:]))
        time.sleep(0.3)


def test_every_dashboard_query_names_exported_metrics_and_labels(live: Live) -> None:
    for _ in range(3):
        _complete(live.url)
    _relayout(live, 1, [], None)  # reconcile passes and a transition: the control metrics
    _complete(live.url)
    from tessera.gateway import metrics

    declared = promql.declared_labels(metrics.GatewayMetrics().registry)
    declared |= promql.declared_labels(control.Recorder().registry)
    seen: dict[str, set[str]] = {}
    for url in [f"{live.url}/metrics", *live.agent_metrics]:
        for name, labels in promql.exported(_get(url), declared).items():
            seen.setdefault(name, set()).update(labels)
    assert (
        "tessera_control_actions_total" in seen and "loop" in seen["tessera_control_actions_total"]
    )
    found = []
    for make in dashboards.ALL.values():
        found += promql.problems(make(), seen, dashboards.TARGET_LABELS)
    assert not found, "\n".join(found)


def _chromium(args: list[str], timeout: float = 60) -> str:
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return out.stdout


@pytest.mark.skipif(
    not CHROMIUM,
    reason="headless Chromium is not installed (Debian: apt-get install chromium); "
    "the status page is not rendered in a browser here",
)
def test_status_page_in_chromium_shows_every_replica_and_stage_during_a_relayout(
    live: Live, tmp_path: Path
) -> None:
    artifacts = Path(os.environ.get("TESSERA_ARTIFACTS_DIR") or tmp_path) / "status-page"
    artifacts.mkdir(parents=True, exist_ok=True)
    page = f"{live.url}/status"

    doms: list[str] = []

    def shoot(i: int) -> Path:
        """A screenshot, and the DOM of the same load, checked for consistency: every
        replica the table lists (routed or not) has stage boxes in the picture, and every
        replica drawn has a row."""
        path = artifacts / f"status-{i:02d}.png"
        dom = _chromium([f"--screenshot={path}", "--window-size=1280,1400", "--dump-dom", page])
        rows = set(re.findall(r'<tr data-replica="([^"]+)"', dom))
        drawn = set(re.findall(r'class="stage" data-replica="([^"]+)"', dom))
        assert rows == drawn, (i, rows, drawn)
        doms.append(dom)
        return path

    def check_dom(status: dict[str, Any]) -> None:
        dom = _chromium(["--dump-dom", page])
        boxes = set(
            re.findall(
                r'class="stage" data-replica="([^"]+)" data-stage="(\d+)" data-agent="([^"]+)"',
                dom,
            )
        )
        assert {(r, int(s), a) for r, s, a in boxes} >= _stages(status), dom[:2000]
        for rid in status["replicas"]:
            assert f'<tr data-replica="{rid}"' in dom
        for loop in ("reconcile", "transition"):
            assert f'<tr data-loop="{loop}">' in dom

    start = _relayout(live, 0, [], None)  # whatever ran before: back to 2 whole replicas
    check_dom(start)
    shots = [shoot(0)]
    moved = _relayout(live, 2, shots, shoot)  # 1 whole + a 2-stage pipeline at 0-6|6-8
    check_dom(moved)
    shots.append(shoot(len(shots)))
    pipeline = [r for r in moved["replicas"] if sum(1 for x in _stages(moved) if x[0] == r) == 2]
    assert len(pipeline) == 1, moved
    assert all(p.stat().st_size > 10_000 for p in shots), shots
    leaving_seen = sum('data-leaving="1"' in d for d in doms)
    (artifacts / "shots.txt").write_text(
        f"{len(shots)} screenshots; {leaving_seen} show a replica not routed (mid-transition)\n"
    )
    (artifacts / "status.json").write_text(json.dumps(moved, indent=2))
