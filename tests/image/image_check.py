"""`make image-check`: smoke tests of every role inside the built images, run as the chart does.

Needs root, buildah and the images of `make image` (control plane and agent). Each process
runs in a container (tests/image/containers.py): read-only root filesystem, uid/gid 10001,
tmpfs /tmp, the model cache read-only at /models, the host's network. Checks, in order:

1. the control-plane image has no torch and no transformers (neither in its site-packages
   nor importable), the agent image has both (the control); `tessera agent` in the
   control-plane image fails with a message naming torch; `tessera plan` (scipy's HiGHS)
   plans there what it plans on the host;
2. in both images the process runs as 10001:10001, `/` is read-only and /tmp writable;
3. the agent image serves a tiny checkpoint through `tessera agent`;
4. the test API server (KMock, `tessera_operator.testing`, on the host) and
   `tessera operator` in the control-plane image: one ServingDeployment reconciled to
   Ready with the blocks loaded on that agent; the liveness endpoint answers;
5. the gateway Deployment the operator wrote is run as written (its image must be the
   control-plane image; its args; the routes ConfigMap and the model at its mount paths): it
   answers a completion whose tokens are Hugging Face transformers' greedy tokens for the
   same prompt on the same weights (computed on the host).

Prints one JSON object (image sizes, the last build's times from build/image/build.json,
this run's timings) and writes it to build/image/check.json. Exits 1 on the first failure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TypeVar

from tests.image import containers

ROOT = Path(__file__).resolve().parents[2]
BUILD_JSON = ROOT / "build" / "image" / "build.json"
CHECK_JSON = ROOT / "build" / "image" / "check.json"
VERSION = "0.1.0"
UID = "10001"
MODEL_ROOT = "/models"
PROMPT = "Hello, world!"
NEW_TOKENS = 8
GROUP, API_VERSION, PLURAL = "serving.tessera.dev", "v1alpha1", "servingdeployments"
NO_TORCH = (
    "import importlib.util as u, json; "
    "print(json.dumps([m for m in ('torch', 'transformers') if u.find_spec(m)]))"
)
T = TypeVar("T")


class CheckFailed(Exception):
    """One smoke test failed; the message says which and why."""


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise CheckFailed(what)


def poll(what: str, fn: Callable[[], T | None], timeout: float, every: float = 0.5) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := fn()) is not None:
            return value
        time.sleep(every)
    raise CheckFailed(f"timed out after {timeout:.0f}s waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _site_packages(rootfs: Path) -> list[str]:
    return sorted(p.name for p in rootfs.glob("opt/tessera/lib/python3*/site-packages/*"))


def check_contents(cp: containers.Container, agent: containers.Container, work: Path) -> None:
    """1: torch and transformers only in the agent image."""
    cp_dists = _site_packages(cp.rootfs)
    expect(bool(cp_dists), f"{cp.image}: empty /opt/tessera site-packages")
    heavy = [d for d in cp_dists if d.split("-")[0].lower() in ("torch", "transformers")]
    expect(not heavy, f"{cp.image} contains {heavy}")
    for ctr, want in ((cp, []), (agent, ["torch", "transformers"])):
        proc = ctr.run(["python", "-c", NO_TORCH], work)
        expect(proc.returncode == 0, f"{ctr.image}: python failed: {proc.stderr[-2000:]}")
        found = json.loads(proc.stdout.strip().splitlines()[-1])
        expect(found == want, f"{ctr.image}: importable {found}, expected {want}")
    proc = cp.run(["tessera", "agent", "--devices", "cpu:1x1GiB"], work)
    expect(
        proc.returncode == 2 and "'torch'" in proc.stderr,
        f"`tessera agent` in {cp.image}: exit {proc.returncode}, {proc.stderr[-500:]!r}",
    )


def _untimed(doc: Any) -> Any:
    """A JSON document without its wall-clock fields (keys named `seconds`)."""
    if isinstance(doc, dict):
        return {k: _untimed(v) for k, v in doc.items() if k != "seconds"}
    if isinstance(doc, list):
        return [_untimed(v) for v in doc]
    return doc


def check_planner(cp: containers.Container, work: Path) -> None:
    """1b: the planner (scipy's HiGHS, what the pruned scipy must still hold) plans in the
    control-plane image exactly what it plans on the host."""
    argv = ["plan", "-f", "planner/llama2-13b-h100.yaml", "--cluster",
            "clusters/2x8-h100.yaml", "--json"]  # fmt: skip
    host = subprocess.run(
        [sys.executable, "-m", "tessera.cli.main", *argv], cwd=ROOT / "examples",
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    inside = cp.run(
        ["sh", "-c", 'cd /examples && exec tessera "$@"', "sh", *argv],
        work, [(ROOT / "examples", "/examples")], timeout=300,
    )  # fmt: skip
    expect(inside.returncode == 0, f"tessera plan in {cp.image}: {inside.stderr[-2000:]}")
    expect(
        _untimed(json.loads(inside.stdout)) == _untimed(json.loads(host.stdout)),
        f"tessera plan in {cp.image} differs from the host's:\n{inside.stdout[:2000]}",
    )


def check_user_and_root(ctr: containers.Container, work: Path) -> None:
    """2: uid/gid 10001, `/` read-only, /tmp writable."""
    script = (
        "id -u; id -g; (touch /probe 2>/dev/null && echo root-writable) || echo root-read-only;"
        " touch /tmp/probe && echo tmp-writable"
    )
    proc = ctr.run(["sh", "-c", script], work)
    got = proc.stdout.split()
    want = [UID, UID, "root-read-only", "tmp-writable"]
    expect(got == want, f"{ctr.image}: {got} (stderr {proc.stderr[-500:]!r}), expected {want}")


def make_model(models: Path) -> Path:
    """The tiny checkpoint (8 layers), world-readable, under `models` (mounted at /models)."""
    from tessera_agent import tiny_checkpoint as tc

    path = tc.make_tiny(models / "tiny-llama", tc.TinySpec())
    for p in [models, *models.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return path


def manifest(name: str, gateway_port: int) -> dict[str, Any]:
    stage = {"agent": "agent-0", "device": "cpu:0", "layers": [0, 8]}
    return {
        "apiVersion": f"{GROUP}/{API_VERSION}",
        "kind": "ServingDeployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "model": {"name": "tiny-llama", "path": f"{MODEL_ROOT}/tiny-llama"},
            "layout": {
                "mode": "explicit",
                "kvCacheBytes": 16 << 20,
                "replicas": [{"name": "r0", "stages": [stage]}],
            },
            "gateway": {"port": gateway_port},
        },
    }


def ready_condition(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == "Ready" and c["status"] == "True":
            return obj
    return None


def hf_tokens(model: Path) -> list[str]:
    """transformers' greedy continuation of PROMPT (EOS ignored), each token's own text as
    the gateway's codec writes it in `logprobs.tokens`."""
    import torch
    from transformers import AutoModelForCausalLM

    from tessera.gateway import tokenizer

    codec = tokenizer.TextCodec.load(model)
    ids = torch.tensor([codec.encode(PROMPT, add_special_tokens=True)])
    hf = AutoModelForCausalLM.from_pretrained(model)
    hf.generation_config.eos_token_id = None
    out = hf.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS,
        pad_token_id=0,
    )  # fmt: skip
    return [codec.token_text(t) for t in out[0, ids.shape[1] :].tolist()]


def complete(url: str) -> dict[str, Any]:
    body = {
        "model": "tiny-llama", "prompt": PROMPT, "max_tokens": NEW_TOKENS, "temperature": 0,
        "ignore_eos": True, "logprobs": 1,
    }  # fmt: skip
    req = urllib.request.Request(
        f"{url}/v1/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=60) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


@contextmanager
def stopping(proc: containers.Process, log: dict[str, str]) -> Iterator[containers.Process]:
    """Stop the process on exit; keep its output tail for the report."""
    try:
        yield proc
    finally:
        proc.stop()
        log[proc.label] = proc.tail(40)


def run_checks(cp_image: str, agent_image: str, work: Path, timings: dict[str, float]) -> str:
    """Every check; returns the completion text. Raises CheckFailed on the first failure."""
    from kubernetes import client

    from tessera_operator.testing import background

    logs: dict[str, str] = {}
    with ExitStack() as stack:
        cp = containers.Container.create(cp_image, "tessera-image-check-cp")
        stack.callback(cp.remove)
        agent = containers.Container.create(agent_image, "tessera-image-check-agent")
        stack.callback(agent.remove)
        try:
            t0 = time.monotonic()
            check_contents(cp, agent, work)
            check_planner(cp, work)
            for ctr in (cp, agent):
                check_user_and_root(ctr, work)
            timings["static_checks_s"] = time.monotonic() - t0

            models = work / "models"
            model = make_model(models)
            expected = hf_tokens(model)
            mounts = [(models, MODEL_ROOT)]

            t0 = time.monotonic()
            agent_proc = stack.enter_context(stopping(agent.spawn(
                ["tessera", "agent", "--agent-id", "agent-0", "--host", "127.0.0.1",
                 "--port", "0", "--devices", "cpu:1x2GiB", "--threads", "1"],
                work, mounts,
            ), logs))  # fmt: skip
            m = agent_proc.wait_for(r"listening on (\S+):(\d+)", timeout=180)
            agent_address = f"{m.group(1)}:{m.group(2)}"
            timings["agent_start_s"] = time.monotonic() - t0

            api = background.ApiServerThread().start()
            stack.callback(api.stop)
            kube = client.ApiClient(client.Configuration(host=api.url))
            stack.callback(kube.close)
            t0 = time.monotonic()
            live_port = free_port()
            stack.enter_context(stopping(cp.spawn(
                ["tessera", "operator", "--api-server", api.url,
                 "--agent", f"agent-0={agent_address}", "--model-root", MODEL_ROOT,
                 "--allow-host-path",  # the manifest's checkpoint is a folder, not a PVC
                 "--namespace", "default", "--resync", "2", "--gateway-image", cp_image,
                 "--liveness", f"http://127.0.0.1:{live_port}/healthz"],
                work, mounts,
            ), logs))  # fmt: skip
            gateway_port = free_port()
            custom = client.CustomObjectsApi(kube)
            custom.create_namespaced_custom_object(
                GROUP, API_VERSION, "default", PLURAL, manifest("tiny", gateway_port)
            )
            obj = poll(
                "the ServingDeployment to be Ready",
                lambda: ready_condition(
                    custom.get_namespaced_custom_object(
                        GROUP, API_VERSION, "default", PLURAL, "tiny"
                    )
                ),
                timeout=300,
            )
            timings["operator_ready_s"] = time.monotonic() - t0
            expect(obj["status"]["readyReplicas"] == 1, f"status: {obj['status']}")
            with urllib.request.urlopen(f"http://127.0.0.1:{live_port}/healthz", timeout=10) as r:
                expect(r.status == 200, f"operator liveness: HTTP {r.status}")

            dep = client.AppsV1Api(kube).read_namespaced_deployment("tiny-gateway", "default")
            cm = client.CoreV1Api(kube).read_namespaced_config_map("tiny-gateway-routes", "default")
            pod = dep.spec.template.spec
            (container,) = pod.containers
            expect(container.image == cp_image, f"gateway image {container.image}")
            routes_dir = work / "routes"
            routes_dir.mkdir(mode=0o755)
            for key, text in cm.data.items():
                (routes_dir / key).write_text(text)
                (routes_dir / key).chmod(0o644)
            volumes = {v.name: v for v in pod.volumes}
            binds: list[tuple[Path, str]] = []
            for mount in container.volume_mounts:
                vol = volumes[mount.name]
                if vol.config_map is not None:
                    binds.append((routes_dir, mount.mount_path))
                else:  # the checkpoint's hostPath, a folder under the node's model cache
                    node_path = Path(vol.host_path.path)
                    binds.append((models / node_path.relative_to(MODEL_ROOT), mount.mount_path))
            t0 = time.monotonic()
            gateway = stack.enter_context(stopping(
                cp.spawn(["tessera", *container.args], work, binds), logs
            ))  # fmt: skip
            gateway.wait_for(r"gateway listening on", timeout=120)
            url = f"http://127.0.0.1:{gateway_port}"
            answer = complete(url)
            timings["gateway_first_completion_s"] = time.monotonic() - t0
            choice = answer["choices"][0]
            expect(answer["usage"]["completion_tokens"] == NEW_TOKENS, f"completion: {answer}")
            tokens = choice["logprobs"]["tokens"]
            expect(tokens == expected, f"completion tokens {tokens} != transformers {expected}")
            return str(choice["text"])
        except Exception:
            stack.close()  # stop the processes first, so their logs are complete
            for label, tail in logs.items():
                sys.stderr.write(f"---- {label} (last lines) ----\n{tail}\n")
            raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--control-plane-image", default=f"localhost/tessera-control-plane:{VERSION}"
    )
    parser.add_argument("--agent-image", default=f"localhost/tessera-agent:{VERSION}")
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or shutil.which("buildah") is None:
        sys.stderr.write("image-check: needs root and buildah (run `make image` first)\n")
        return 1
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    timings: dict[str, float] = {}
    start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="tessera-image-check."))
    work.chmod(0o755)
    try:
        text = run_checks(args.control_plane_image, args.agent_image, work, timings)
    except (CheckFailed, RuntimeError) as exc:
        sys.stderr.write(f"image-check FAILED: {exc}\n")
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    timings["total_s"] = time.monotonic() - start
    sizes = {
        name: containers.image_size(image)
        for name, image in (
            ("control_plane", args.control_plane_image),
            ("agent", args.agent_image),
        )
    }
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
        "images": {
            "control_plane": args.control_plane_image,
            "agent": args.agent_image,
        },
        "size_mb": {k: round(v / 1e6) for k, v in sizes.items()},
        "build": json.loads(BUILD_JSON.read_text()) if BUILD_JSON.is_file() else None,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "completion": text,
        "result": "pass",
    }
    CHECK_JSON.parent.mkdir(parents=True, exist_ok=True)
    CHECK_JSON.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
