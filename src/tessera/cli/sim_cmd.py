"""`tessera sim -f MANIFEST --cluster CLUSTER.yaml --trace TRACE`: simulate a deployment.

Runs the real planner on the manifest and cluster, then the discrete-event simulator
(`tessera.sim`) over the trace (time- and rate-scaled) or a synthetic Poisson stream, with
the chosen control-plane policies; prints a summary (or `--json`) with a rich progress
bar, and writes plots with `--plots DIR`. Every number printed is a simulation.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tessera import fields
from tessera.cli import input_files

POLICIES = ("overload",)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "sim",
        help="simulate a deployment on a cluster over a trace (planner + policies, simulated)",
        description=__doc__,
    )
    p.add_argument("-f", "--filename", dest="manifest", required=True, help="ServingDeployment")
    p.add_argument("--cluster", required=True, help="cluster YAML (see docs/planner.md)")
    p.add_argument("--trace", help="trace file (Azure CSV, BurstGPT CSV or JSONL)")
    p.add_argument("--poisson", type=float, default=0.0, help="synthetic Poisson rate (req/s)")
    p.add_argument("--profile", help="cost profile JSON (default: analytic)")
    p.add_argument("--gpus", type=int, default=0, help="GPU budget (default: the whole cluster)")
    p.add_argument("--duration", type=float, default=0.0, help="simulated seconds (0: trace)")
    p.add_argument("--time-scale", type=float, default=1.0, help="trace speed-up factor")
    p.add_argument("--rate-scale", type=float, default=1.0, help="trace rate multiplier")
    p.add_argument("--policies", default="", help=f"comma list of: {', '.join(POLICIES)}")
    p.add_argument("--tick", type=float, default=1.0, help="control-loop period (s)")
    p.add_argument("--plots", help="write latency/memory/deployment PNGs here")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run_sim)


def _fail(msg: str) -> int:
    sys.stderr.write(f"tessera sim: error: {msg}\n")
    return 2


def run_sim(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from tessera.cost import profile as profile_mod
    from tessera.sim import arrivals, control, engine, plots, report, setup
    from tessera.workload import traces

    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        return _fail(f"--policies: unknown {unknown} (known: {', '.join(POLICIES)})")
    if not args.trace and args.poisson <= 0:
        return _fail("give --trace TRACE or --poisson RATE")
    try:
        prof = None
        if args.profile:
            prof = profile_mod.profile_from_json(json.loads(Path(args.profile).read_text()))
        planned = setup.plan_from_files(
            input_files.read_yaml(args.manifest, "-f"),
            Path(args.manifest).parent,
            input_files.read_yaml(args.cluster, "--cluster"),
            prof,
            args.gpus or None,
        )
        if args.trace:
            reqs = traces.read_trace(args.trace)
            if args.duration:
                reqs = arrivals.tile(reqs, args.duration * args.time_scale)
            arr = arrivals.replay(
                reqs,
                time_scale=args.time_scale,
                rate_scale=args.rate_scale,
                duration=args.duration or None,
                seed=args.seed,
            )
        else:
            mix = [(c.rate or 1.0, c.input_tokens, c.output_tokens) for c in planned.inputs.classes]
            arr = arrivals.poisson(args.poisson, args.duration or 60.0, mix, args.seed)
    except (fields.FieldError, ValueError, OSError) as exc:
        return _fail(str(exc))
    plan, problem = planned.plan, planned.problem
    memory = problem.gpu_memory_bytes
    reps = setup.from_plan(plan, problem.profile, problem.comm, memory)
    router = setup.router_for(plan, planned.inputs.classes, args.seed)
    ctrls: list[engine.Controller] = []
    if "overload" in policies:
        tps = {r.tp for r in plan.replicas}
        ctrls.append(control.KunServe(problem.profile, problem.comm, max(tps), memory))
    horizon = args.duration or (arr[-1].time if arr else 0.0)
    console = Console(stderr=True)
    began, cpu = time.perf_counter(), time.process_time()
    with Progress(
        TextColumn("simulating"),
        BarColumn(),
        TextColumn("{task.fields[t]}"),
        TimeElapsedColumn(),
        console=console,
        disable=args.json,
    ) as bar:
        task = bar.add_task("sim", total=max(horizon, 1e-9), t="")

        def progress(now: float) -> None:
            bar.update(task, completed=min(now, horizon), t=f"{now:,.0f}/{horizon:,.0f} s")

        res = engine.Engine(reps, router, ctrls, args.tick, progress).run(arr, until=horizon)
    out = report.summary(res)
    out.update(
        note="simulation: step times from the cost model "
        f"({problem.profile.source} profile), not measurements",
        deployment=[f"{r.name}: tp{r.tp} pp{r.pp}" for r in plan.replicas],
        gpus=sum(len(r.gpus) for r in plan.replicas),
        arrivals=len(arr),
        policies=policies,
        wall_s=round(time.perf_counter() - began, 2),
        cpu_s=round(time.process_time() - cpu, 2),
    )
    if args.plots:
        out["plots"] = [str(p) for p in plots.plot_run(res, Path(args.plots))]
    if args.json:
        sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
        return 0
    console = Console()
    console.print(f"[bold]Simulation[/bold] ({out['note']})")
    console.print(
        f"{out['gpus']} GPUs, {len(plan.replicas)} replicas; {len(arr)} requests; "
        f"policies: {', '.join(policies) or 'none'}"
    )
    for key in (
        "throughput_rps",
        "throughput_tok_s",
        "ttft_p50_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "tpot_p99_s",
        "e2e_p50_s",
        "e2e_p99_s",
        "preemptions",
        "unfinished",
        "wall_s",
        "cpu_s",
    ):
        console.print(
            f"  {key:<18} {out[key]:.4g}"
            if isinstance(out[key], float)
            else f"  {key:<18} {out[key]}"
        )
    return 0
