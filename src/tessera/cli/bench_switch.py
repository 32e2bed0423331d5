"""Switch benchmark (Proof 1): a layout switch by peer copies vs by reloading.

`tessera bench switch --json` makes a tiny but wider checkpoint (`--hidden 512`, ~100 MB) and
runs `tessera up` (2 local agents) on the same trace load in two modes: `peer` (`--sourcing
switch`: parts chosen by the OServe switch plan, `policies.switch_sources`) and `reload`
(`--sourcing storage`). Both read storage through a throttle (`--storage-bandwidth`, 100 MB/s
per agent, standing for network storage); peer copies are not throttled. `--rounds N`
alternates the modes; times are medians, ratios medians of per-round ratios. Each run switches
twice during the replay (`bench_relayout.LAYOUTS`), with long requests decoding on the leaving
replica. Keys: `switch_s_peer` / `switch_s_reload` (sum over switches of manifest written →
cut-over; `*_per_switch`, `complete_s_*`), `peer_vs_reload`, `bytes_moved`
(`bytes_between_agents`), `plan_vs_bound` (greedy plan / LP bound, model output),
`p99_ttft_during_vs_steady`, `lost`, `tokens_match` (against `transformers`).
"""

from __future__ import annotations

import argparse
import itertools
import random
import tempfile
from pathlib import Path
from typing import Any

from tessera import blocks, model_facts
from tessera.bench import harness, local_up, oracle, trace
from tessera.cli import bench_relayout as rl
from tessera.policies import device_links, links, placement
from tessera.policies.switching import switch_bound
from tessera.policies.transition import copy_sources as switch_sources

SEQUENCE = [0, 1, 2]  # layouts of bench_relayout.LAYOUTS: start, then two switches
MODES = {"peer": "switch", "reload": "storage"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    trace.add_arguments(parser, requests=60, time_scale=2.0, max_input=256, max_output=32)
    rl.transition_arguments(parser, long_tokens=96, timeout_s=300.0)
    parser.add_argument(
        "--storage-bandwidth", type=float, default=100e6, help="bytes/s per agent (declared)"
    )
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--intermediate", type=int, default=1408)
    parser.add_argument("--modes", default="peer,reload", help="comma-separated: peer, reload")
    parser.add_argument("--rounds", type=int, default=1, help="runs per mode, interleaved")


def _one_run(
    args: argparse.Namespace, model: Path, tmp: Path, mode: str, k: int = 0
) -> tuple[rl.Run, list[str]]:
    path = tmp / f"{mode}{k}.yaml"
    rl.write_manifest(path, model, SEQUENCE[0])
    env = {
        # the local agents read the checkpoint through a reader throttled to this bandwidth
        "TESSERA_STORAGE_BYTES_PER_S": str(args.storage_bandwidth),
        "COLUMNS": "400",  # one line per load in its log
    }
    flags = ["--drain-deadline", str(args.drain_deadline), "--watch-interval", "0.2"]
    flags += ["--sourcing", MODES[mode]]
    with local_up.Up(path, *flags, env=env, what="switch") as up:
        harness.note("switch", f"{mode}: serving at {up.url}")
        run = rl.replay(
            args,
            up,
            SEQUENCE,
            lambda k: rl.LAYOUTS[k][0],
            lambda k: rl.write_manifest(path, model, k),
            random.Random(args.seed),
            settle_s=None,
            poll_s=0.05,
            what="switch",
        )
    return run, up.log


def _blocks(layout: int, gens: dict[str, int], model: Path) -> list[tuple[str, blocks.Block]]:
    out = []
    for r in rl.LAYOUTS[layout][1]:
        n = len(r["stages"])
        for i, s in enumerate(r["stages"]):
            out.append(
                (
                    s["agent"],
                    blocks.Block(
                        str(model),
                        s["layers"][0],
                        s["layers"][1],
                        f"{r['name']}.g{gens[r['name']]}",
                        i,
                        s["device"],
                        num_stages=n,
                    ),
                )
            )
    return out


def _bytes(b: blocks.Block, mbytes: placement.ModelBytes) -> float:
    u0, u1 = switch_sources.units_of(b, mbytes.num_layers)
    return sum(mbytes.unit_bytes(u) for u in range(u0, u1))


def planned(model: Path) -> list[dict[str, Any]]:
    """The switch plan and its LP bound for each switch of SEQUENCE (model output)."""
    from tessera.control import converge

    shape = model_facts.served_shape(str(model), "float32")
    assert shape is not None
    mbytes = converge.switch_model(shape)
    link_model = device_links.from_agent_links(links.LinkModel())
    gens = {r["name"]: 1 for r in rl.LAYOUTS[SEQUENCE[0]][1]}
    out = []
    for a, b in itertools.pairwise(SEQUENCE):
        old = {r["name"]: r for r in rl.LAYOUTS[a][1]}
        new_gens = dict(gens)
        for r in rl.LAYOUTS[b][1]:
            if old.get(r["name"]) != r:
                new_gens[r["name"]] = max(gens.values()) + 1
        held = [switch_sources.Held(ag, "", blk, "s") for ag, blk in _blocks(a, gens, model)]
        keep = {(ag, blk.key) for ag, blk in _blocks(a, gens, model)}
        wanted = [
            switch_sources.Wanted(ag, "", blk, "s")
            for ag, blk in _blocks(b, new_gens, model)
            if (ag, blk.key) not in keep
        ]
        got = switch_sources.assign(held, wanted, mbytes, link_model)
        assert got.plan is not None
        lower = got.bound(link_model)
        assert lower is not None
        tiers = dict(got.plan.bytes_by_tier)
        out.append(
            {
                "to": rl.LAYOUTS[b][0],
                "bytes_moved": int(got.plan.bytes_moved),
                "bytes_between_agents": int(tiers.get(device_links.INTER, 0.0)),
                "bytes_from_storage": int(got.plan.bytes_from_storage),
                "bytes_reload": int(sum(_bytes(w.block, mbytes) for w in wanted)),
                "plan_s": got.plan.seconds,
                "bound_s": lower.seconds,
                "plan_vs_bound": round(switch_bound.ratio(got.plan, lower), 3),
                "parts": {
                    f"{w.agent}/{w.block.replica_id}/{w.block.stage_index}": [
                        [list(p.units), p.source.agent if p.source else "storage"]
                        for p in got.parts.get((w.agent, w.block.key), ())
                    ]
                    for w in wanted
                },
            }
        )
        gens = new_gens
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes) or args.rounds < 1:
        raise SystemExit(f"tessera bench switch: --modes takes {', '.join(MODES)}; --rounds >= 1")
    with tempfile.TemporaryDirectory(prefix="tessera-switch-") as tmp:
        tiny = ["--hidden", str(args.hidden), "--intermediate", str(args.intermediate)]
        model = local_up.make_tiny(
            Path(tmp) / "tiny-llama", *tiny, "--heads", "8", "--kv-heads", "4"
        )
        plans = planned(model)
        runs = harness.interleave(
            modes, args.rounds, lambda m, k: _one_run(args, model, Path(tmp), m, k)
        )
        every = [q for rs in runs.values() for r, _ in rs for q in r.requests]
        completed = [q for q in every if q.ok]
        harness.note(
            "switch", f"replays done: {len(completed)} completed; comparing with transformers"
        )
        matches = oracle.matches(model, completed)
        param_bytes = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    out: dict[str, Any] = {}
    sums: dict[str, list[float]] = {}
    for mode, rs in runs.items():
        cuts = [[w.cut - w.start for w in r.windows] for r, _ in rs]
        sums[mode] = [sum(c) for c in cuts]
        out[f"switch_s_{mode}"] = round(harness.median(sums[mode]), 2)
        out[f"switch_s_{mode}_rounds"] = [round(x, 2) for x in sums[mode]]
        out[f"switch_s_{mode}_per_switch"] = [
            round(harness.median([c[i] for c in cuts]), 2) for i in range(len(SEQUENCE) - 1)
        ]
        out[f"complete_s_{mode}"] = [
            round(harness.median([r.windows[i].end - r.windows[i].start for r, _ in rs]), 2)
            for i in range(len(SEQUENCE) - 1)
        ]
        out[f"loads_{mode}"] = [x.split("✓ ", 1)[1] for x in rs[0][1] if "✓ load " in x]
    if "peer" in runs and "reload" in runs:  # per round: the two runs of one round
        ratios = [b / max(a, 1e-9) for a, b in zip(sums["peer"], sums["reload"], strict=True)]
        out["peer_vs_reload"] = round(harness.median_ratio(sums["reload"], sums["peer"]), 2)
        out["peer_vs_reload_rounds"] = [round(x, 2) for x in ratios]
    first = runs[modes[0]]
    steady: list[float] = []
    busy: list[float] = []
    for r, _ in first:
        for q in r.requests:
            if q.ok and q.ttft is not None:
                inside = any(w.start <= q.sent <= w.end for w in r.windows)
                (busy if inside else steady).append(q.ttft)
    p99_steady, p99_busy = harness.pct(steady, 99), harness.pct(busy, 99)
    lost = [q for q in every if not q.ok]
    out.update(
        {
            "bytes_moved": [p["bytes_moved"] for p in plans],
            "bytes_between_agents": [p["bytes_between_agents"] for p in plans],
            "bytes_reload": [p["bytes_reload"] for p in plans],
            "plan_vs_bound": [p["plan_vs_bound"] for p in plans],
            "plans": plans,
            "p99_ttft_steady_ms": round(p99_steady * 1e3, 1),
            "p99_ttft_during_ms": round(p99_busy * 1e3, 1),
            "p99_ttft_during_vs_steady": round(p99_busy / p99_steady, 2) if p99_steady else None,
            "ttft_of": modes[0],
            "requests_during_switches": len(busy),
            "requests_sent": len(every),
            "lost": len(lost),
            "lost_examples": [q.error or "stream ended early" for q in lost[:5]],
            "tokens_match": bool(matches) and all(matches),
            "tokens_compared": len(matches),
            "cutover_requests": {m: [r.cutover for r, _ in rs] for m, rs in runs.items()},
            "switches": [rl.LAYOUTS[i][0] for i in SEQUENCE[1:]],
            "rounds": args.rounds,
            "storage": f"throttled checkpoint reader, {args.storage_bandwidth / 1e6:g} MB/s per "
            "agent (declared; the page cache is faster); peer copies unthrottled",
            "checkpoint_bytes": param_bytes,
            "machine": harness.machine(),
            "setup": f"tessera up, 2 local agents (cpu:1x2GiB), tiny llama 8 layers hidden "
            f"{args.hidden}, KV 64 MiB per stage, {args.requests} trace requests at time scale "
            f"{args.time_scale}, drain deadline {args.drain_deadline} s; layouts: "
            + " -> ".join(rl.LAYOUTS[i][0] for i in SEQUENCE),
        }
    )
    return out
