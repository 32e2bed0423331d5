"""Operator reconcile: seconds from create to Ready, API requests per converged pass, gRPC actions.

`tessera bench reconcile --json` (registered in `tessera.cli.bench`). Runs the real
operator (in a thread) against the KMock test API server
(`tessera_operator.testing`, needs the `dev` extra) and local agent processes holding a
tiny checkpoint made with `tessera model make-tiny`. For each of `--deployments`
ServingDeployments (2 replicas, 3 blocks, as in examples/local-tiny.yaml) it measures the
seconds from the create request until status shows Ready=True. Then, with everything
converged, it counts the operator's API requests over `--window` seconds of resync
timer passes: requests per converged pass = requests / passes (one pass reads the
routes ConfigMap once, which counts the passes). gRPC actions are counted from the
operator's BlockLoaded/BlockUnloaded events.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from tessera.bench import deployment
from tessera.cli import local_agents

GROUP, VERSION, PLURAL = deployment.GROUP, deployment.VERSION, deployment.PLURAL


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--deployments", type=int, default=3, help="ServingDeployments created")
    p.add_argument("--resync", type=float, default=1.0, help="operator timer period (s)")
    p.add_argument("--window", type=float, default=10.0, help="converged window measured (s)")
    p.add_argument("--model", type=Path, default=None, help="checkpoint (default: make a tiny one)")


def _manifest(name: str, model: Path) -> dict[str, Any]:
    stage = {"device": "cpu:0"}
    pipe = [
        {**stage, "agent": "agent-0", "layers": [0, 4]},
        {**stage, "agent": "agent-1", "layers": [4, 8]},
    ]
    replicas = [
        {"name": "r0", "stages": [{**stage, "agent": "agent-0", "layers": [0, 8]}]},
        {"name": "r1", "stages": pipe},
    ]
    return deployment.manifest(name, model, replicas, 16 << 20)


def _ready(api: Any, name: str) -> bool:
    obj = api.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def _wait(fn: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _make_model(out: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "tessera.cli.main", "model", "make-tiny", str(out)],
        check=True,
        capture_output=True,
    )
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from kubernetes import client

    from tessera.control import agents
    from tessera.policies.security import admission
    from tessera_operator import config
    from tessera_operator.testing import background

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or _make_model(Path(tmp) / "tiny-llama")
        with (
            local_agents.local_agents(2, devices="cpu:1x512MiB") as procs,
            background.ApiServerThread() as srv,
        ):
            refs = tuple(agents.AgentRef(p.agent_id, p.address) for p in procs)
            cfg = config.OperatorConfig(
                agents=refs,
                api_server=srv.url,
                resync_seconds=args.resync,
                # the checkpoint lies in a temporary folder, mounted by hostPath
                admission=admission.Limits(("/",), allow_host_path=True),
            )
            kube = client.ApiClient(client.Configuration(host=srv.url))
            kube.user_agent = "tessera-bench/0"
            api = client.CustomObjectsApi(kube)
            with background.OperatorThread(cfg):
                to_ready = []
                for i in range(args.deployments):
                    name = f"bench-{i}"
                    t0 = time.monotonic()
                    api.create_namespaced_custom_object(
                        GROUP, VERSION, "default", PLURAL, _manifest(name, model)
                    )
                    _wait(lambda n=name: _ready(api, n), 120.0, f"{name} Ready")
                    to_ready.append(time.monotonic() - t0)
                time.sleep(2 * args.resync)  # let the passes that follow Ready settle
                before = srv.counts()
                time.sleep(args.window)
                after = srv.counts()
            events = client.CoreV1Api(kube).list_namespaced_event("default").items
            cast(Any, kube).close()  # through Any: the client's annotations vary by release
    window = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    window = {k: v for k, v in window.items() if v}
    passes = window.get(("get", "", "configmaps"), 0)
    writes = sum(v for (verb, _, _), v in window.items() if verb not in ("get", "list", "watch"))
    reasons = [e.reason for e in events]
    return {
        "deployments": args.deployments,
        "agents": 2,
        "blocks_per_deployment": 3,
        "resync_s": args.resync,
        "create_to_ready_s": [round(t, 3) for t in to_ready],
        "create_to_ready_s_median": round(statistics.median(to_ready), 3),
        "converged_window_s": args.window,
        "converged_passes": passes,
        "api_requests_per_converged_pass": round(sum(window.values()) / passes, 2)
        if passes
        else None,
        "api_writes_in_converged_window": writes,
        "api_requests_in_window_by_verb": {
            f"{verb} {group + '/' if group else ''}{res}": n
            for (verb, group, res), n in sorted(window.items())
        },
        "grpc_load_actions": reasons.count("BlockLoaded"),
        "grpc_unload_actions": reasons.count("BlockUnloaded"),
        "grpc_failed_actions": reasons.count("BlockLoadFailed")
        + reasons.count("BlockUnloadFailed"),
        "grpc_describe_per_converged_pass": 2,
        "note": "describe count per converged pass is by construction (one Describe per agent "
        "when the diff is empty); API requests are counted at the KMock test API server",
    }
