"""Cold start of a replica from storage, from a peer and from the host cache.

`tessera bench coldstart --json [--tiny]`: three local agents whose checkpoint reads are
throttled to `--storage-bandwidth` (200 MB/s, as a network volume), agent-2 with a host block
cache; a random float32 Llama checkpoint of at least 500 MB (`--tiny`: 2 layers); links measured
once (`link_probe.LinkProbe`); spec changes converged by the reconcile core, each timed from the
change to the new replica's first greedy token. Per round: `storage` (r0, every byte from
storage), `peer` (r1 sourced from r0), `host_cache` (r2 back on agent-2 from its host cache).
`ready_s_*` are medians over `--rounds` (single runs in `runs`); `tokens_match` against
transformers' float32 greedy (`--no-hf` skips); bytes by source and the links are reported.
Decode is eager (`TESSERA_COMPILE_DECODE=0`). Then sleep and wake (`bench_wake.measure`):
`first_token_s_from_zero`, `lost`, `wake_s` (target <= 0.2 x `ready_s_storage`).
docs/scaling.md.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPT = [5, 17, 42, 7, 99, 3]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (tests)")
    parser.add_argument("--storage-bandwidth", type=float, default=200e6, help="bytes/s")
    parser.add_argument("--host-cache", default="2GiB")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-hf", dest="hf", action="store_false")
    parser.add_argument("--zero-requests", type=int, default=4, help="per scale-from-zero burst")


def _layout(model: Path, replicas: list[tuple[str, str]], layers: int) -> dict[str, Any]:
    return {
        "apiVersion": "serving.tessera.dev/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": "cold", "namespace": "default"},
        "spec": {
            "model": {"name": "cold", "path": str(model), "dtype": "float32"},
            "layout": {
                "mode": "explicit",
                "kvCacheBytes": 16 << 20,
                "replicas": [
                    {
                        "name": name,
                        "stages": [{"agent": agent, "device": "cpu:0", "layers": [0, layers]}],
                    }
                    for name, agent in replicas
                ],
            },
        },
    }


class _Run:
    """The agents and the reconcile state between spec changes."""

    def __init__(self, model: Path, layers: int, refs: list[Any], probe: Any) -> None:
        self.model, self.layers, self.refs, self.probe = model, layers, refs, probe
        self.tls = probe.tls  # the agents' TLS files (None: plaintext)
        self.published: Any = None

    async def converge(self, replicas: list[tuple[str, str]], apply: bool = True) -> Any:
        """Passes until nothing is left to do (at most 6); the last outcome. No gateway
        reloads routes here: an idle replica counts as drained at once."""
        from tessera import api
        from tessera.control import converge
        from tessera.policies.transition import planner as transition

        dep = api.parse(_layout(self.model, replicas, self.layers))
        drain = transition.DrainPolicy(settle_s=0.0)
        rollout = converge.Rollout(drain=drain, probe=self.probe)
        out = None
        for _ in range(6 if apply else 1):
            out = await converge.converge(
                dep,
                str(self.model),
                self.refs,
                apply=apply,
                published=self.published,
                rollout=rollout,
                tls=self.tls,
            )
            self.published = out.routes
            if out.remaining is not None and not out.remaining.steps and out.serving:
                break
        return out

    async def delete(self) -> None:
        """Unload every block of the deployment (the finalizer's path)."""
        from tessera import reconcile
        from tessera.control import actuate, agents

        obs = await agents.observe(self.refs, tls=self.tls)
        await actuate.apply(reconcile.delete_actions(obs, "default.cold."), tls=self.tls)
        self.published = None

    async def first_token(self, address: str, replica_id: str, n: int) -> tuple[float, list[int]]:
        """(seconds to the first token, the greedy tokens) of one request."""
        from tessera.rpc import sampling as rpc_sampling
        from tessera.rpc import transport
        from tessera.rpc.v1 import agent_pb2 as pb
        from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

        began = time.perf_counter()
        channel = transport.channel(address, self.tls)
        first = 0.0
        tokens: list[int] = []
        try:
            req = pb.GenerateRequest(
                replica_id=replica_id,
                request_id=f"cold-{replica_id}-{time.monotonic_ns()}",
                prompt_token_ids=PROMPT,
                params=rpc_sampling.to_proto(rpc_sampling.Sampling(max_tokens=n, ignore_eos=True)),
            )
            async for chunk in pb_grpc.AgentStub(channel).Generate(req, timeout=120):
                if chunk.token_ids and not first:
                    first = time.perf_counter() - began
                tokens += list(chunk.token_ids)
        finally:
            await channel.close()
        return first, tokens


def _sources(out: Any, replica_id: str) -> dict[str, float]:
    loads = [x for a in out.observed.agents for x in a.loads if x.replica_id == replica_id]
    return {
        "peer": sum(x.peer_bytes for x in loads),
        "host": sum(x.host_bytes for x in loads),
        "storage": sum(x.storage_bytes for x in loads),
    }


async def _timed(run: _Run, replicas: list[tuple[str, str]], name: str, n: int) -> dict[str, Any]:
    began = time.perf_counter()
    out = await run.converge(replicas)
    converged = time.perf_counter() - began
    rid = next(r.replica_id for r in out.plan.replicas if r.name == name)
    agent = out.observed.agent(dict(replicas)[name])
    ttft, tokens = await run.first_token(agent.address, rid, n)  # sent once converged
    return {
        "replica_id": rid,
        "ready_s": round(converged + ttft, 3),
        "converge_s": round(converged, 3),
        "ttft_s": round(ttft, 3),
        "tokens": tokens,
        "sources": _sources(out, rid),
        "agent_ready_s": round(
            sum(x.seconds for a in out.observed.agents for x in a.loads if x.replica_id == rid), 3
        ),
        "steps": [r.action.describe() for r in out.results if r.ok],
    }


def _checkpoint(args: argparse.Namespace, tmp: Path) -> tuple[Path, int]:
    from tessera_agent import random_checkpoint

    shape = random_checkpoint.Shape(
        layers=2 if args.tiny else args.layers,
        hidden=128 if args.tiny else args.hidden,
        heads=4 if args.tiny else 16,
        kv_heads=2 if args.tiny else 8,
        intermediate=256 if args.tiny else args.intermediate,
        vocab=512 if args.tiny else args.vocab,
        max_positions=4096,
    )
    path = random_checkpoint.make(tmp / "cold-model", shape, "float32")
    return path, shape.layers


def _hf_greedy(model: Path, n: int) -> list[int]:
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(model), torch_dtype=torch.float32)
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False, min_new_tokens=n
        )
    return [int(t) for t in out[0, len(PROMPT) :]]


async def _measure(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from tessera.cli import local_agents
    from tessera.control import agents, link_probe
    from tessera.policies import links

    model, layers = _checkpoint(args, tmp)
    nbytes = (model / "model.safetensors").stat().st_size
    slow = ["--storage-bandwidth", str(args.storage_bandwidth)]
    procs = await asyncio.gather(  # started side by side: each imports torch
        *(
            asyncio.to_thread(
                local_agents.start_agent,
                f"agent-{i}",
                "cpu:1x3GiB",
                args.threads,
                extra_args=slow + (["--host-cache", args.host_cache] if i == 2 else []),
            )
            for i in range(3)
        )
    )
    try:
        refs = [agents.AgentRef(p.agent_id, p.address) for p in procs]
        probe = link_probe.LinkProbe(procs[0].tls)
        obs = await agents.observe(refs, tls=probe.tls)
        measured = await probe.links(links.LinkModel(), obs, str(model))
        run = _Run(model, layers, refs, probe)
        await run.converge([("r0", "agent-0")], apply=False)  # imports, first connections
        n = args.tokens
        runs: dict[str, list[dict[str, Any]]] = {"storage": [], "peer": [], "host_cache": []}
        r0, r1, r2 = ("r0", "agent-0"), ("r1", "agent-1"), ("r2", "agent-2")
        for _ in range(args.rounds):
            runs["storage"].append(await _timed(run, [r0], "r0", n))
            runs["peer"].append(await _timed(run, [r0, r1], "r1", n))
            await run.converge([r0, r2])  # r2 fills agent-2 (from r0, or its cache)
            await run.converge([r0])  # r2 leaves: its pieces stay in agent-2's host cache
            runs["host_cache"].append(await _timed(run, [r0, r2], "r2", n))
            await run.delete()
        zero = await _from_zero(run, model, r2, args, procs[2].address)
    finally:
        for p in procs:
            await asyncio.to_thread(local_agents.stop_agent, p)
    every = [x["tokens"] for rs in runs.values() for x in rs]
    same = all(t == every[0] for t in every) and len(every[0]) == n
    hf = _hf_greedy(model, n) if args.hf else None
    ready = {k: statistics.median(x["ready_s"] for x in rs) for k, rs in runs.items()}
    return {
        "checkpoint_bytes": nbytes,
        "storage_throttle": (
            f"{args.storage_bandwidth / 1e6:.0f} MB/s per agent: the agent's checkpoint reader "
            "(--storage-bandwidth) makes every read take at least bytes / bandwidth"
        ),
        "measured_links": {
            "pairs_bytes_per_s": {f"{a}->{b}": round(r) for (a, b), r in measured.pairs.items()},
            "storage_bytes_per_s": {a: round(r) for a, r in measured.storage.items()},
        },
        "rounds": args.rounds,
        "ready_s_storage": ready["storage"],
        "ready_s_peer": ready["peer"],
        "ready_s_host_cache": ready["host_cache"],
        "peer_vs_storage": round(ready["peer"] / ready["storage"], 3),
        "host_cache_vs_storage": round(ready["host_cache"] / ready["storage"], 3),
        "tokens_match": same and (hf is None or hf == every[0]) and zero["tokens_match"],
        "tokens_match_transformers": None if hf is None else hf == every[0],
        "runs": runs,
        "first_token_s_from_zero": zero["median_first_token_s_from_zero"],
        "wake_s": zero["wake_s"],
        "lost": zero["lost"],
        "wake_vs_storage": round(zero["wake_s"] / ready["storage"], 3),
        "from_zero": zero,
        "ready": "spec change to the new replica's first token (converge, then one request)",
        "decode": "eager (TESSERA_COMPILE_DECODE=0)",
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
    }


async def _from_zero(
    run: _Run, model: Path, at: tuple[str, str], args: argparse.Namespace, address: str
) -> dict[str, Any]:
    """Sleep/wake and scale-from-zero figures of replica `at` (module docstring)."""
    from tessera.cli import bench_wake

    out = await run.converge([at])
    rid = next(r.replica_id for r in out.plan.replicas if r.name == at[0])
    try:
        got = await bench_wake.measure(
            str(model), address, rid, args.rounds, args.zero_requests, args.tokens, tls=run.tls
        )
    finally:
        await run.delete()
    got["median_first_token_s_from_zero"] = round(
        statistics.median(got["first_token_s_from_zero_rounds"]), 4
    )
    return got


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tessera-coldstart-") as tmp:
        return asyncio.run(_measure(args, Path(tmp)))
