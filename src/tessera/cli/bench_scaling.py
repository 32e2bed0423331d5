"""Module-level scaling benchmark (CoCoServe): layer replication on local agents.

`tessera bench scaling --json`: the tiny checkpoint, two local agents (one `cpu:0` device and
one torch thread each), a whole replica on agent-0, agent-1 idle. `op_table` (CoCoServe Table
2): for 1, 2, 4 and all layers, with requests decoding, replicate layers [0, n) onto agent-1,
let requests join, evict, then migrate agent-0's own layers [0, n); time, step-loop pause and
bytes of each. Load sweep: per offered load (Poisson, req/s) the same requests with the policy
off and on (the driver applies Algorithm 1), interleaved: `throughput_ratio_by_load` and
`p99_ratio_by_load` (on / off). `--via operator` (`bench_scaling_operator`): the same keys,
the operator's loop acting. On a 2-core machine shared by both agents a replica adds no
compute: the sweep measures the split's overhead, not CoCoServe's gain from idle devices;
the operations (tokens, time, bytes, pause) are what it shows.
"""

from __future__ import annotations

import argparse
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tessera.bench import options
from tessera.cli import local_agents
from tessera.control import agents as agent_client
from tessera.control import scaling_driver
from tessera.policies.scaling import module_scaling as ms
from tessera.rpc import sampling as rpc_sampling
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

LAYERS = 8


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--loads", default="2,4,8", help="offered loads, requests/s")
    p.add_argument("--requests", type=int, default=12, help="requests per load and policy")
    p.add_argument("--tokens", type=int, default=24, help="output tokens per request")
    p.add_argument("--sizes", default="1,2,4,8", help="layers per operation in op_table")
    options.add_seed(p)
    options.add_via(
        p,
        "up",
        "this process drives the agents (as `tessera up`)",
        "the operator's loop does, against the test API server, requests go through a gateway",
    )
    p.add_argument("--tick-s", type=float, default=1.0, help="--via operator: the loop's tick")
    p.add_argument("--tpot-ms", type=float, default=1000.0, help="--via operator: the TPOT SLO")
    p.add_argument(
        "--migrate-wait-s", type=float, default=20.0, help="--via operator: wait for a migrate"
    )


def _stub(a: local_agents.AgentProcess) -> pb_grpc.AgentStub:
    return pb_grpc.AgentStub(transport.sync_channel(a.address, a.tls))


def _load(a: local_agents.AgentProcess, model: Path) -> None:
    _stub(a).LoadBlock(
        pb.LoadBlockRequest(
            model_path=str(model),
            layer_start=0,
            layer_end=LAYERS,
            device="cpu:0",
            replica_id="r0",
            stage_index=0,
            num_stages=1,
            kv_bytes=32 << 20,
        ),
        timeout=120.0,
    )


def _generate(a: local_agents.AgentProcess, prompt: list[int], tokens: int) -> int:
    n = 0
    for ch in _stub(a).Generate(
        pb.GenerateRequest(
            replica_id="r0",
            prompt_token_ids=prompt,
            params=rpc_sampling.to_proto(rpc_sampling.Sampling(max_tokens=tokens, ignore_eos=True)),
        ),
        timeout=600.0,
    ):
        n += len(ch.token_ids)
    return n


def _background(
    a: local_agents.AgentProcess, prompts: list[list[int]], tokens: int
) -> list[threading.Thread]:
    ts = [threading.Thread(target=_generate, args=(a, p, tokens), daemon=True) for p in prompts]
    for t in ts:
        t.start()
    return ts


def _running(a: local_agents.AgentProcess) -> int:
    return sum(k.running for k in _stub(a).Describe(pb.DescribeRequest()).kv)


def _wait(cond: Any, timeout: float = 120.0) -> bool:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            return False
        time.sleep(0.02)
    return True


def _row(r: pb.ScalingOpReply, n: int) -> dict[str, Any]:
    return {
        "op": r.op,
        "layers": n,
        "seconds": round(r.seconds, 4),
        "pause_ms": round(r.pause_s * 1e3, 3),
        "param_bytes": r.param_bytes,
        "kv_bytes": r.kv_bytes,
        "kv_pages": r.kv_pages,
        "requests_moved": r.requests,
    }


def _op_table(
    a: local_agents.AgentProcess, b: local_agents.AgentProcess, model: Path, sizes: list[int]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    rng = random.Random(1)
    sa = _stub(a)
    for n in sizes:

        def req(
            n: int = n, target_address: str = "", self_address: str = "", holder: str = ""
        ) -> pb.ScalingOpRequest:
            return pb.ScalingOpRequest(
                replica_id="r0",
                layer_start=0,
                layer_end=n,
                target_address=target_address,
                self_address=self_address,
                holder=holder,
            )

        prompts = [[0, *(rng.randrange(5, 500) for _ in range(40))] for _ in range(4)]
        ts = _background(a, prompts[:2], 200)
        _wait(lambda: _running(a) >= 2)
        rep = sa.ScalingReplicate(req(target_address=b.address, self_address=a.address))
        rows.append(_row(rep, n))
        ts += _background(a, prompts[2:], 200)  # these join the replica

        def joined(holder: str = rep.target) -> bool:
            runs = sa.Describe(pb.DescribeRequest()).scaling_runs
            return any(h.name == holder and h.requests for r in runs for h in r.holders)

        _wait(joined, 60.0)
        rows.append(_row(sa.ScalingEvict(req(holder=rep.target)), n))
        mig = sa.ScalingMigrate(req(target_address=b.address, self_address=a.address))
        rows.append(_row(mig, n))
        for t in ts:
            t.join(300)
        sa.UnloadBlock(pb.UnloadBlockRequest(replica_id="r0", stage_index=0))  # and b's run
        _load(a, model)
    return rows


def _timed(
    a: local_agents.AgentProcess,
    prompt: list[int],
    tokens: int,
    lat: list[float],
    lock: threading.Lock,
) -> None:
    t0 = time.perf_counter()
    _generate(a, prompt, tokens)
    with lock:
        lat.append(time.perf_counter() - t0)


def _sweep(
    a: local_agents.AgentProcess,
    b: local_agents.AgentProcess,
    loads: list[float],
    n: int,
    tokens: int,
    seed: int,
) -> dict[str, Any]:
    d = scaling_driver.ScalingDriver(
        origin=scaling_driver.Peer(a.agent_id, a.address),
        replica_id="r0",
        num_layers=LAYERS,
        hidden=256,
        peers=[scaling_driver.Peer(b.agent_id, b.address)],
        cfg=ms.ScalingConfig(enabled=True),
        replica_bytes=4 << 20,  # one tiny layer's weights (1.5 MiB) plus its KV share
        channels=agent_client.Channels(a.tls),
    )
    out: dict[str, Any] = {"throughput_ratio_by_load": {}, "p99_ratio_by_load": {}, "runs": []}
    for load in loads:
        res: dict[str, dict[str, float]] = {}
        for policy in ("off", "on"):
            rng = random.Random(seed)
            prompts = [[0, *(rng.randrange(5, 500) for _ in range(24))] for _ in range(n)]
            gaps = [rng.expovariate(load) for _ in range(n)]
            before = len(d.applied)
            if policy == "on":
                d.tick_up(batch=max(1, int(load)))
            applied = [f"[{o.start},{o.end})->{o.target}" for o, _ in d.applied[before:]]
            lat: list[float] = []
            lock = threading.Lock()
            t_start = time.perf_counter()
            ts = []
            for p, g in zip(prompts, gaps, strict=True):
                time.sleep(g)
                t = threading.Thread(target=_timed, args=(a, p, tokens, lat, lock))
                t.start()
                ts.append(t)
            for t in ts:
                t.join(600)
            wall = time.perf_counter() - t_start
            lat.sort()
            p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
            res[policy] = {"tokens_per_s": n * tokens / wall, "p99_s": p99}
            out["runs"].append(
                {
                    "gamma_used": round(d.gamma, 3),
                    "load_rps": load,
                    "policy": policy,
                    "tokens_per_s": round(n * tokens / wall, 2),
                    "p99_s": round(p99, 3),
                    "replicated": applied,
                }
            )
            if policy == "on":
                gamma = d.measure_gamma()  # the next loads decide with it
                out["runs"][-1]["gamma_measured"] = None if gamma is None else round(gamma, 3)
                d.evict_all()
        key = str(load)
        out["throughput_ratio_by_load"][key] = round(
            res["on"]["tokens_per_s"] / res["off"]["tokens_per_s"], 3
        )
        out["p99_ratio_by_load"][key] = round(res["on"]["p99_s"] / res["off"]["p99_s"], 3)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    loads = [float(x) for x in args.loads.split(",") if x]
    sizes = [int(x) for x in args.sizes.split(",") if x]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tessera-bench-scaling-") as tmp:
        model = Path(tmp) / "tiny-llama"
        subprocess.run(
            [sys.executable, "-m", "tessera.cli.main", "model", "make-tiny", str(model)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        if args.via == "operator":
            from tessera.cli import bench_scaling_operator

            sweep = bench_scaling_operator.run(model, loads, args)
            table = sweep.pop("op_table")
        else:
            a = local_agents.start_agent("agent-0", "cpu:1x2GiB", 1)
            b = local_agents.start_agent("agent-1", "cpu:1x2GiB", 1)
            try:
                _load(a, model)
                table = _op_table(a, b, model, sizes)
                sweep = _sweep(a, b, loads, args.requests, args.tokens, args.seed)
            finally:
                local_agents.stop_agent(a)
                local_agents.stop_agent(b)
    return {
        "bench": "scaling",
        "via": args.via,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": _cpus(),
        "model": f"tiny llama, {LAYERS} layers, hidden 256 (random weights)",
        "op_table": table,
        **sweep,
        "wall_s": round(time.perf_counter() - t0, 1),
        "caveat": (
            "two agents on the same shared 2-core machine: a replica adds no compute, so "
            "ratios measure the split's overhead, not CoCoServe's gain from idle devices"
        ),
    }


def _cpus() -> int:
    import os

    return os.cpu_count() or 0
