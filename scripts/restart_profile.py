"""Where a restart of the tiny model's agent spends its time, with a warm compile cache.

Runs, `--runs` times in a row on one `--compile-cache` folder (the first run fills it when
it is empty; the later runs are restarts with a warm cache):

1. `tessera up` on a one-stage tiny replica (default settings): seconds from the command's
   start to its "serving" line (`ready_s`, the figure issue 29 bounds at 10 s), then one
   streamed completion (TTFT), then SIGTERM;
2. the same agent alone (`tessera agent` + one LoadBlock, as `tessera up` drives it):
   process start to "listening" (`agent_start_s`: interpreter, imports), the LoadBlock
   (`load_s`) and, from the agent's own log lines, the checkpoint load, each compile
   phase, how the decode graphs were obtained (`decode_graphs`: "loaded" skips Dynamo's
   trace, `engine/decode_aot.py`), the agent's compile preparation at start (`prepare_s`,
   on a thread) and the compile state the agent reports (`warm` / `cached`).

Prints one JSON object. The machine should be quiet: on a shared machine the figures
are upper bounds. Usage:
    .venv/bin/python scripts/restart_profile.py --runs 3 [--compile-cache DIR] [--freeze 0]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

_PHASES = {
    "decode_graph_s": re.compile(r"compiled decode ready for layers .* in ([\d.]+) s"),
    "prompt_graphs_s": re.compile(r"compiled prompt rows ready for layers .* in ([\d.]+) s"),
    "warmup_total_s": re.compile(r"compiled graphs of layers .* in ([\d.]+) s"),
}
_HITS = re.compile(r"\((\d+) cache hits, (\d+) misses\)")
_ORIGIN = re.compile(r"; decode graphs: (.*)$")
_PREPARED = re.compile(r"compile prepared in ([\d.]+) s")
_STAMP = re.compile(r"^(\d\d:\d\d:\d\d),(\d\d\d) ")


def _manifest(tmp: Path, model: Path) -> Path:
    from tessera.bench import deployment, local_up

    stages = [{"agent": "agent-0", "device": "cpu:0", "layers": [0, 8]}]
    doc = deployment.manifest("restart", model, [{"name": "r0", "stages": stages}], 64 << 20)
    doc["spec"]["model"]["dtype"] = "float32"
    path = tmp / "m.yaml"
    local_up.write_yaml(path, doc)
    return path


def _up_once(manifest: Path, tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    from tessera.bench import deployment

    cmd = [sys.executable, "-m", "tessera.cli.main", "up", "-f", str(manifest), "--port", "0"]
    cmd += ["--agents", "1", "--state-file", str(tmp / "state.json")]
    t0 = time.perf_counter()
    up = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )
    url, log = "", []
    assert up.stdout is not None
    try:
        for line in up.stdout:
            log.append(line.rstrip())
            m = re.search(r"(http://[\d.]+:\d+)", line)
            if m and "serving" in line:
                url = m.group(1)
                break
        ready = time.perf_counter() - t0
        if not url:
            raise RuntimeError("`tessera up` failed: " + " | ".join(log[-8:]))
        body = json.dumps(
            {
                "model": deployment.MODEL,
                "prompt": "Once upon a time",
                "max_tokens": 16,
                "stream": True,
            }
        ).encode()
        req = urllib.request.Request(
            url + "/v1/completions", body, {"Content-Type": "application/json"}
        )
        t1 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=120) as r:
            r.readline()
            ttft = time.perf_counter() - t1
            r.read()
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        try:
            up.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
    return {"ready_s": round(ready, 2), "first_ttft_ms": round(ttft * 1000, 1)}


def _agent_once(model: Path, env: dict[str, str]) -> dict[str, Any]:
    from tessera.cli import local_agents
    from tessera.rpc.v1 import agent_pb2 as pb

    os.environ.update(env)
    t0 = time.perf_counter()
    agent = local_agents.start_agent("restart", "cpu:1x2GiB", threads=0, timeout=600)
    started = time.perf_counter() - t0
    try:
        t1 = time.perf_counter()
        local_agents.load_pipeline([agent], str(model), [(0, 8)], "r0", 64 << 20)
        load = time.perf_counter() - t1
        from tessera.rpc import transport
        from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

        channel = transport.sync_channel(agent.address, agent.tls)
        try:
            d = pb_grpc.AgentStub(channel).Describe(pb.DescribeRequest())
        finally:
            channel.close()
        compile_state = [b.compile for b in d.blocks] if d.blocks else []
    finally:
        local_agents.stop_agent(agent)
    out: dict[str, Any] = {
        "agent_start_s": round(started, 2),
        "load_s": round(load, 2),
        "compile": compile_state,
    }
    for line in agent.output:
        for key, rx in _PHASES.items():
            m = rx.search(line)
            if m:
                out[key] = float(m.group(1))
        h = _HITS.search(line)
        if h:
            out["cache_hits"], out["cache_misses"] = int(h.group(1)), int(h.group(2))
        how = _ORIGIN.search(line)
        if how:  # "loaded" (Dynamo skipped) or "compiled ..." per decode graph
            out["decode_graphs"] = how.group(1)
        prep = _PREPARED.search(line)
        if prep:
            out["prepare_s"] = float(prep.group(1))
    out["log_tail"] = [x for x in agent.output if "compiled" in x or "loaded" in x][-6:]
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--compile-cache", default="", help="default: a fresh temporary folder")
    p.add_argument("--freeze", default="", help="TESSERA_COMPILE_FREEZE for the agents")
    args = p.parse_args()
    from tessera_agent import tiny_checkpoint

    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        model = tiny_checkpoint.make_tiny(tmp / "tiny", tiny_checkpoint.TinySpec())
        cache = args.compile_cache or str(tmp / "cache")
        env = {**os.environ, "TESSERA_COMPILE_CACHE": cache, "PYTHONUNBUFFERED": "1"}
        if args.freeze:
            env["TESSERA_COMPILE_FREEZE"] = args.freeze
        manifest = _manifest(tmp, model)
        runs = []
        for i in range(args.runs):
            run: dict[str, Any] = {"run": i, "load_avg_1m": os.getloadavg()[0]}
            run["up"] = _up_once(manifest, tmp, env)
            run["agent"] = _agent_once(model, env)
            runs.append(run)
            print(json.dumps(run), file=sys.stderr, flush=True)
    print(json.dumps({"cpus": os.cpu_count(), "runs": runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
