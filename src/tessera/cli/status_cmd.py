"""`tessera status`: what `tessera up` (or any set of agents) is serving, per agent.

Reads the state file `tessera up` writes (`up_cmd.STATE_FILE`), observes the agents and
prints replicas, stages, blocks, KV pages, adapters and each agent's block zoo (issue 14),
overload groups (issue 13) and replicated layer runs (issue 15, `scaling_status`).
Registered by `up_cmd.register`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from tessera import blocks


def _variant_facts(
    obs: Any, tls: Any
) -> tuple[dict[tuple[str, str, int], tuple[str, ...]], dict[str, str]]:
    """Per (agent, replica, stage) the adapters attached (and a stitched front's stitch,
    issue 35), per agent its block zoo (issue 14)."""
    import grpc

    from tessera.rpc import transport
    from tessera.rpc.v1 import agent_pb2 as pb
    from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

    adapters: dict[tuple[str, str, int], tuple[str, ...]] = {}
    zoo: dict[str, str] = {}
    for a in obs.agents:
        if not a.reachable:
            continue
        channel = transport.sync_channel(a.address, tls)
        try:
            d = pb_grpc.AgentStub(channel).Describe(pb.DescribeRequest(), timeout=5)
        except grpc.RpcError:  # the table shows "-" for what could not be read
            continue
        finally:
            channel.close()
        for b in d.blocks:
            extra = _stitch(b) + _speculate(b)  # issue 35
            adapters[(a.name, b.replica_id, b.stage_index)] = tuple(b.variants) + extra
        z = d.zoo
        zoo[a.name] = f"{z.param_bytes / 2**20:.1f} ({z.pieces}, {z.shared_pieces})"
    return adapters, zoo


def _speculate(b: Any) -> tuple[str, ...]:
    """A speculated bottleneck (issue 35): its surrogate and the hits and misses so far."""
    if not b.HasField("speculate"):
        return ()
    s = b.speculate
    return (
        f"speculated ({s.kind} surrogate): {s.hits} hits, {s.misses} misses over "
        f"{s.speculated_steps} steps",
    )


def _stitch(b: Any) -> tuple[str, ...]:
    """A stitched chain's front (issue 35): where its stitch leads, the quality measured."""
    if not b.HasField("stitch"):
        return ()
    s = b.stitch
    to = s.next_model_path.rstrip("/").rsplit("/", 1)[-1]
    return (
        f"stitch -> {to} from layer {s.next_layer_start} (cosine {s.cosine:.4f}, "
        f"top-1 {s.top1_agreement:.4f})",
    )


def overload_groups(rows: list[tuple[str, int, int, str, blocks.Block]]) -> list[str]:
    """Each multi-stage replica as a group: its agents, each block's layers and KV pages
    (a KunServe drop turns whole replicas into one such pipeline, led by the head)."""
    by: dict[str, list[str]] = {}
    for rid, _, rank, name, b in rows:
        if b.num_stages > 1 and rank == 0:
            by.setdefault(rid, []).append(f"{name} [{b.start}, {b.end}) {b.kv_pages} pages")
    return [f"{rid}: " + " | ".join(parts) for rid, parts in sorted(by.items())]


def status(args: argparse.Namespace) -> int:
    """`tessera status`: replicas, stages, blocks and KV use per agent, from the state file."""
    from rich.console import Console
    from rich.table import Table

    from tessera.control import agents
    from tessera.rpc import transport

    tls = transport.tls_from_dir(os.environ.get(transport.TLS_DIR_ENV, ""))  # an entry point
    if args.agent:
        refs = agents.static_agents(args.agent)
        gateway = ""
    else:
        try:
            state = json.loads(args.state_file.read_text())
        except FileNotFoundError:
            sys.stderr.write(
                f"tessera status: no {args.state_file}; is `tessera up` running "
                "here? (or pass --agent NAME=HOST:PORT)\n"
            )
            return 1
        refs = [agents.AgentRef(a["name"], a["address"]) for a in state["agents"]]
        gateway = state.get("gateway", "")
    obs = asyncio.run(agents.observe(refs, tls=tls))
    extra = _variant_facts(obs, tls)
    console = Console()
    if gateway:
        console.print(f"gateway: {gateway}")
    replicas = Table(title="replicas")
    for col in (
        "replica",
        "stage",
        "tp rank",
        "agent",
        "device",
        "layers",
        "params MiB",
        "KV MiB",
        "KV pages",
        "data plane",
        "compile",
        "variants (adapters)",
    ):
        replicas.add_column(col)
    rows = sorted(
        (b.replica_id, b.stage_index, b.tp_rank, a.name, b) for a in obs.agents for b in a.blocks
    )
    for rid, idx, rank, name, b in rows:
        plane = "-"
        if b.tp_size > 1:
            plane = f"{b.transport} {b.group_state}" + (
                f": {b.group_reason}" if b.group_reason else ""
            )
        replicas.add_row(
            rid,
            f"{idx + 1}/{b.num_stages}",
            f"{rank}/{b.tp_size}",
            name,
            b.device,
            f"[{b.start}, {b.end})",
            f"{b.param_bytes / 2**20:.1f}",
            f"{b.kv_bytes / 2**20:.1f}",
            str(b.kv_pages),
            plane,
            b.compile or "-",
            ", ".join(extra[0].get((name, rid, idx), ())) or "-",
        )
    console.print(replicas)
    from tessera.cli import scaling_status

    scaling_status.print_runs(console, [(r.name, r.address) for r in refs], tls)
    groups = overload_groups(rows)
    if groups:
        console.print(
            "pipelines (stages: agent, layers, KV pages; an overload drop's group shows here "
            "as its head's replica): " + "; ".join(groups)
        )
    table = Table(title="agents")
    for col in (
        "agent",
        "address",
        "state",
        "devices (free/capacity MiB)",
        "blocks",
        "KV pages used/total, prefix-cache hit tokens (replicas led)",
        "block zoo MiB (pieces, shared)",
    ):
        table.add_column(col)
    for a in obs.agents:
        devs = ", ".join(
            f"{d.id} {d.free_bytes / 2**20:.0f}/{d.capacity_bytes / 2**20:.0f}" for d in a.devices
        )
        kv = ", ".join(
            f"{k.replica_id}: {k.pages_used}/{k.pages_total}, {k.prefix_hit_tokens} hit"
            for k in a.kv
        )
        table.add_row(
            a.name,
            a.address,
            "up" if a.reachable else f"DOWN: {a.error}",
            devs,
            str(len(a.blocks)),
            kv or "-",
            extra[1].get(a.name, "-"),
        )
    console.print(table)
    return 0 if all(a.reachable for a in obs.agents) else 1
