"""Wake and scale-from-zero benchmark: `wake_s`, `first_token_s_from_zero`, `lost`.

`tessera bench wake --json` makes a checkpoint (`--layers`, `--hidden`: about 510 MB float32 by
default, `--tiny` a few MB), starts one local agent with a host block cache (and
`--storage-bandwidth`, 0 unthrottled), loads a whole replica (`ready_s_storage`) and an
in-process gateway holding requests while no replica is awake. `--rounds` times: the replica
sleeps, a burst of `--requests` greedy streams arrives, the gateway holds them and wakes it;
`first_token_s_from_zero` is the first request's TTFT at the client, `lost` the requests not
completed with the awake answer's text. `wake_s`: a separate sleep/wake pair's `WakeReplica`
wall time (`wake_s_agent`: the agent's own), timed after the sleep's clean-up is over.
`measure(...)` is what `tessera bench coldstart` calls with its own agent and checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tessera.bench import client
from tessera.cli import local_agents
from tessera.gateway import config as gw_config
from tessera.gateway import hold
from tessera.gateway import server as gw_server
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

MODEL = "bench-wake"
PROMPT = [0, 17, 42, 99, 7, 3, 250, 11]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tiny", action="store_true", help="the test's tiny checkpoint")
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--storage-bandwidth", type=float, default=200e6, help="bytes/s")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=8)


async def _stream(url: str, max_tokens: int) -> client.Stream:
    """One greedy streamed completion of `PROMPT` (`error` says why it failed)."""
    s = client.Stream(list(PROMPT), max_tokens)
    async with client.session(600.0) as sess:
        await client.send(sess, url, MODEL, s)
    return s


async def measure(
    model_path: str,
    address: str,
    replica_id: str,
    rounds: int = 2,
    requests: int = 8,
    max_tokens: int = 8,
    *,
    tls: transport.TlsFiles | None,
) -> dict[str, Any]:
    """Sleep/wake and scale-from-zero figures of a loaded replica (module docstring)."""
    cfg = gw_config.GatewayConfig(
        MODEL,
        model_path,
        port=0,
        replicas=(gw_config.ReplicaEndpoint(replica_id, address),),
        poll_interval_s=0.5,
        hold=hold.HoldConfig(max_held=max(requests, 1), deadline_s=300.0),
        tls=tls,
    )
    gateway = await gw_server.start_gateway(cfg)
    channel = transport.channel(address, tls)
    stub = pb_grpc.AgentStub(channel)
    try:
        awake = await _stream(gateway.url, max_tokens)
        if awake.error:
            raise SystemExit(f"tessera bench wake: the awake replica answered {awake.error}")
        ttft_awake = awake.ttft if awake.ttft is not None else float("nan")
        want = awake.text
        from_zero: list[float] = []
        lost = mismatched = 0
        for _ in range(rounds):
            await stub.SleepReplica(pb.SleepReplicaRequest(replica_id=replica_id))
            await asyncio.sleep(0.5)  # as below: requests come after the sleep's clean-up
            await gateway.refresh()  # the gateway knows it sleeps: zero awake
            assert not gateway.ready_replicas()
            got = await asyncio.gather(*(_stream(gateway.url, max_tokens) for _ in range(requests)))
            ok = [g for g in got if not g.error]
            ttfts = [g.ttft if g.ttft is not None else float("nan") for g in ok]
            from_zero.append(min(ttfts) if got else float("nan"))
            lost += len(got) - len(ok)
            mismatched += sum(1 for g in ok if g.text != want)
        await stub.SleepReplica(pb.SleepReplicaRequest(replica_id=replica_id))
        # A replica wakes long after it slept: let the sleep's clean-up (the agent reclaims
        # the unloaded blocks' heap on its event loop) finish before timing the wake.
        await asyncio.sleep(0.5)
        await stub.Describe(pb.DescribeRequest())
        t0 = time.perf_counter()
        woke = await stub.WakeReplica(pb.WakeReplicaRequest(replica_id=replica_id))
        wake_s = time.perf_counter() - t0
        return {
            "wake_s": round(wake_s, 4),
            "wake_s_agent": round(woke.seconds, 4),
            "restored_bytes": woke.restored_bytes,
            "first_token_s_from_zero": round(from_zero[0], 4),
            "first_token_s_from_zero_rounds": [round(x, 4) for x in from_zero],
            "ttft_awake_s": round(ttft_awake, 4),
            "lost": lost,
            "requests_from_zero": rounds * requests,
            "tokens_match": mismatched == 0,
        }
    finally:
        await channel.close()
        await gateway.stop()


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tessera_agent import tiny_checkpoint as tc

    spec = tc.TinySpec() if args.tiny else tc.TinySpec(layers=args.layers, hidden=args.hidden,
                                                         heads=8, kv_heads=4)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="tessera-bench-wake-") as tmp:
        model = tc.make_tiny(Path(tmp) / "m", spec)
        size = sum(p.stat().st_size for p in model.glob("*.safetensors"))
        extra = ["--host-cache", f"{(2 * size >> 20) + 64}MiB"]
        if args.storage_bandwidth:
            extra += ["--storage-bandwidth", str(int(args.storage_bandwidth))]
        agent = local_agents.start_agent("wake-0", "cpu:1x16GiB", 1, extra_args=extra)
        try:
            t0 = time.perf_counter()
            local_agents.load_pipeline([agent], str(model), [(0, spec.layers)], "r0")
            ready_s = time.perf_counter() - t0
            out = asyncio.run(
                measure(
                    str(model),
                    agent.address,
                    "r0",
                    args.rounds,
                    args.requests,
                    args.max_tokens,
                    tls=agent.tls,
                )
            )
        finally:
            local_agents.stop_agent(agent)
    ratio = out["wake_s"] / ready_s if ready_s else float("nan")
    return {
        **out,
        "ready_s_storage": round(ready_s, 4),
        "wake_over_ready_storage": round(ratio, 4),
        "wake_target_met": ratio <= 0.2,
        "checkpoint_bytes": size,
        "storage_throttle": f"agent --storage-bandwidth {int(args.storage_bandwidth)} B/s "
        "(the agent's own reader throttle)"
        if args.storage_bandwidth
        else "none",
        "ready_s_storage_note": "LoadBlock wall time of the first load (storage, page cache warm)",
        "median_first_token_s_from_zero": round(
            statistics.median(out["first_token_s_from_zero_rounds"]), 4
        ),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
    }
