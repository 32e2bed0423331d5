"""Transition planner: seconds to plan a relayout of a large synthetic cluster, and its shape.

`tessera bench transition --json` (registered in `tessera.cli.bench`). Builds a cluster of
`--agents` agents with `--devices` devices each, serving a `--layers`-layer model as
replicas of two-stage pipelines, one replica per two devices; the target re-splits every
replica into a four-stage pipeline over the same devices (every replica changes, so all
get a new generation). It plans the transition with roomy devices (make-before-break) and
with tight ones (the freeing order), timing `transition.plan` (median of `--repeats`),
and reports the steps by kind, the mode, and the bytes held above the larger of the two
layouts at the plan's peak. A pure computation: no agents, no I/O; the byte figures are
the planner's own accounting of its plan, not a measurement of a cluster.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from typing import Any

from tessera import blocks, observed, routes_doc
from tessera.policies.transition import planner as transition

GB = 10**9


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agents", type=int, default=16)
    p.add_argument("--devices", type=int, default=8, help="devices per agent")
    p.add_argument("--layers", type=int, default=80)
    p.add_argument("--layer-gb", type=float, default=1.6, help="parameters per layer")
    p.add_argument("--repeats", type=int, default=5)


def _layout(
    devs: list[tuple[str, str]], layers: int, stages: int, gen: int, layer_bytes: int
) -> list[transition.Placed]:
    """One replica of `stages` equal stages per group of consecutive devices."""
    out = []
    group = 4  # devices per replica slot: two-stage replicas use 2 of them, four-stage 4
    for r, first in enumerate(range(0, len(devs) - group + 1, group)):
        for half in range(2 if stages == 2 else 1):
            rdevs = devs[first + half * 2 : first + half * 2 + stages]
            name = f"r{r}x{half}" if stages == 2 else f"r{r}x0"
            per = layers // stages
            for k in reversed(range(stages)):
                agent, dev = rdevs[k]
                nxt = rdevs[k + 1][0] if k + 1 < stages else ""
                b = blocks.Block(
                    "/m",
                    k * per,
                    (k + 1) * per if k + 1 < stages else layers,
                    replica_id=blocks.replica_id("bench", "d", name, gen),
                    stage_index=k,
                    device=dev,
                    num_stages=stages,
                    next_address=f"{nxt}:1" if nxt else "",
                    generation=gen,
                    param_bytes=per * layer_bytes,
                    kv_bytes=per * layer_bytes // 2,
                )
                out.append(transition.Placed(agent, f"{agent}:1", b))
    return out


def _case(args: argparse.Namespace, capacity: int) -> dict[str, Any]:
    devs = [(f"a{i}", f"cuda:{d}") for i in range(args.agents) for d in range(args.devices)]
    layer_bytes = int(args.layer_gb * GB)
    old = _layout(devs, args.layers, 2, 1, layer_bytes)
    new = _layout(devs, args.layers, 4, 2, layer_bytes)
    held: dict[str, list[blocks.Block]] = collections.defaultdict(list)
    for p in old:
        held[p.agent].append(p.block)
    agents = []
    for i in range(args.agents):
        name = f"a{i}"
        devices = []
        for d in range(args.devices):
            used = sum(b.bytes for b in held[name] if b.device == f"cuda:{d}")
            devices.append(observed.DeviceInfo(f"cuda:{d}", "cuda", capacity, capacity - used))
        agents.append(
            observed.AgentInfo(name, f"{name}:1", True, tuple(devices), tuple(held[name]))
        )
    old_ids = sorted({p.block.replica_id for p in old})
    leaders = {p.block.replica_id: p.address for p in new if p.block.stage_index == 0}
    world = transition.World(
        observed.Observed(tuple(agents)),
        "bench.d.",
        routes_doc.RoutesDoc(tuple(routes_doc.RouteReplica(r, "x:1") for r in old_ids), version=1),
        now=0.0,
    )
    target = transition.Target(
        2, tuple(new), tuple(routes_doc.RouteReplica(r, a) for r, a in leaders.items())
    )
    times = []
    t = transition.plan(world, target)
    for _ in range(args.repeats):
        start = time.perf_counter()
        t = transition.plan(world, target)
        times.append(time.perf_counter() - start)
    old_bytes = sum(p.block.bytes for p in old)
    new_bytes = sum(p.block.bytes for p in new)
    return {
        "device_capacity_gb": capacity / GB,
        "mode": t.mode,
        "blocked": t.blocked.reason if t.blocked else "",
        "plan_s_median": round(statistics.median(times), 4),
        "steps": len(t.steps),
        "steps_by_kind": dict(collections.Counter(s.action.kind for s in t.steps)),
        "peer_copies": sum(1 for s in t.steps if getattr(s.action, "source", None) is not None),
        "old_layout_gb": round(old_bytes / GB, 1),
        "new_layout_gb": round(new_bytes / GB, 1),
        "extra_gb_peak_planned": round((t.peak_bytes - max(old_bytes, new_bytes)) / GB, 1),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    per_device_old = (args.layers // 2) * args.layer_gb * 1.5 * GB
    return {
        "agents": args.agents,
        "devices_per_agent": args.devices,
        "layers": args.layers,
        "replicas_before": (args.agents * args.devices // 4) * 2,
        "replicas_after": args.agents * args.devices // 4,
        "roomy": _case(args, int(per_device_old * 2)),
        "tight": _case(args, int(per_device_old * 1.2)),
        "note": "planning only (pure function over synthetic observed state); byte figures "
        "are the plan's own accounting, not measured on agents",
    }
