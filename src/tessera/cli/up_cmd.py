"""`tessera up -f MANIFEST`: serve a ServingDeployment locally; `tessera status` shows it.

Starts local agent processes (or uses `--agent NAME=HOST:PORT`), converges them to the
manifest with the same reconcile core the operator uses (rich progress bar), starts the
OpenAI-compatible gateway, prints the URL and a curl example, then watches the manifest
(`up_watch`): a saved change runs a transition to the new layout (the operator's converge
pass: pure transition planner + executor; cut-overs go to the in-process gateway, whose
leaving replicas drain or move their requests), and it re-converges every
`--reconcile-interval` seconds so a restarted agent gets its blocks back (and at once
when the autoscaler resizes an auto layout: `up_autoscale`). Ctrl-C or
SIGTERM stops the gateway and every child process. A small state file lets
`tessera status` find the agents.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from tessera.cli import status_cmd, up_args

STATE_FILE = Path(".tessera/up.json")
OVERLOAD_TICK_S = 0.5  # the overload loop's period (spec.policies.overload.enabled)


def register(sub: Any) -> None:
    p = sub.add_parser("up", help="serve a ServingDeployment manifest locally")
    up_args.add_arguments(p)
    p.add_argument("--state-file", type=Path, default=STATE_FILE)
    p.set_defaults(func=_up)
    s = sub.add_parser("status", help="replicas, stages, blocks and KV use per agent")
    s.add_argument("--state-file", type=Path, default=STATE_FILE)
    s.add_argument("--agent", action="append", default=[], help="NAME=HOST:PORT (repeat)")
    s.set_defaults(func=status_cmd.status)


def _fail(msg: str) -> int:
    sys.stderr.write(f"tessera up: {msg}\n")
    return 1


def _up(args: argparse.Namespace) -> int:
    import yaml

    from tessera import api, fields
    from tessera.observability import tracing

    tracing.configure(os.environ)
    try:
        doc = yaml.safe_load(args.file.read_text())
        dep = api.parse(doc)
    except OSError as exc:
        return _fail(f"cannot read {args.file}: {exc}")
    except (fields.FieldError, yaml.YAMLError) as exc:
        return _fail(f"{args.file}: {exc}")
    from tessera.gateway import config as gw_config
    from tessera.policies.serving import gpu_memory

    try:  # the gateway's settings from the environment, checked before anything loads
        args.generate_mux = gw_config.generate_mux_from(os.environ)
        gpu_memory.check_utilization(args.gpu_memory_utilization)
    except ValueError as exc:
        return _fail(str(exc))
    from tessera import event_loop

    return event_loop.run(_serve(args, dep))


def _model_root(dep: Any, model_path: str) -> str:
    """The folder holding the checkpoint and every variant's folder (the agents' root)."""
    from tessera.control import variants as variant_ops

    paths = [os.path.realpath(model_path)]
    resolved = variant_ops.resolve(dep.spec.variants, model_path)
    paths += [os.path.realpath(v.path) for v in resolved]
    paths += [os.path.realpath(v.zoo) for v in resolved if v.zoo]  # stitched chains' zoo
    return os.path.commonpath(paths)


def _outside_root(dep: Any, model_path: str, root: str) -> list[str]:
    """Why an edited manifest's variants cannot load: folders the agents may not read."""
    from tessera.control import variants as variant_ops
    from tessera.policies.security import access

    problems = []
    for i, v in enumerate(variant_ops.resolve(dep.spec.variants, model_path)):
        if not access.check_model_path(v.path, os.path.realpath(v.path), root).allowed:
            problems.append(
                f"spec.variants[{i}]: {v.path} is outside the agents' model root {root} "
                "(restart `tessera up`, or start it with a wider --model-root)"
            )
    return problems


def _agent_args(args: argparse.Namespace, model_root: str) -> tuple[str, ...]:
    """The flags every local agent gets beside its id, devices and threads (the model
    root first: callers print `[1]`)."""
    return (
        "--model-root",
        model_root,
        "--gpu-memory-utilization",
        str(args.gpu_memory_utilization),
    )


def _local_agent_count(args: argparse.Namespace, dep: Any) -> int:
    if args.agents:
        return int(args.agents)
    names = {p.agent for r in dep.spec.layout.replicas for s in r.stages for p in s.placements()}
    return len(names) or 2


async def _serve(args: argparse.Namespace, dep: Any) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    from tessera import gc_heap, reconcile, routes_doc
    from tessera.cli import (
        local_agents,
        supervise,
        up_autoscale,
        up_overload,
        up_policies,
        up_report,
        up_watch,
    )
    from tessera.control import actuate, agents, converge, link_probe, observation, scaling_loop
    from tessera.gateway import config as gw_config
    from tessera.gateway import routes as gw_routes
    from tessera.gateway import server as gw_server
    from tessera.policies.serving import cpu_share
    from tessera.policies.transition import planner as transition
    from tessera.rpc import transport

    console = Console(stderr=True)
    model_path = converge.resolve_model_path(dep.spec, args.file.resolve().parent)
    if not (Path(model_path) / "config.json").is_file():
        return _fail(
            f"spec.model.path: no checkpoint at {model_path} "
            "(make one with `tessera model make-tiny`)"
        )
    from tessera.cli import variant_check

    bad = variant_check.check(dep, model_path)
    if bad:
        return _fail("; ".join(bad))
    agent_args = _agent_args(args, str(args.model_root or _model_root(dep, model_path)))
    auto = None
    if args.profile is not None:
        from tessera.cost import profile as profile_mod
        from tessera.planner import auto as auto_mod

        auto = auto_mod.default_auto_planner(
            profile_mod.profile_from_json(json.loads(args.profile.read_text()))
        )
    settle_heap = gc_heap.wanted(os.environ)  # this process owns its heap (see gc_heap)
    try:  # the TLS files of every channel to the agents (None: plaintext)
        tls = transport.tls_from_dir(os.environ.get(transport.TLS_DIR_ENV, ""))
    except FileNotFoundError as exc:
        return _fail(str(exc))
    rollout = converge.Rollout(
        drain=transition.DrainPolicy(deadline_s=args.drain_deadline),
        sourcing=args.sourcing,
        probe=link_probe.LinkProbe(tls),  # measured links for every new replica's sources
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    procs: list[local_agents.AgentProcess] = []
    supervisor = None
    threads = 0
    gateway = None
    scaling: up_policies.ScalingPolicy | None = None
    overload: up_overload.UpOverload | None = None
    overload_task: asyncio.Task[None] | None = None
    autoscale_task: asyncio.Task[None] | None = None
    autoscaler: up_autoscale.UpAutoscale | None = None
    refs: list[agents.AgentRef] = []
    try:
        if args.agent:
            refs = agents.static_agents(args.agent)
            if tls is None:
                console.print(f"[bold yellow]WARNING[/] {transport.PLAINTEXT_WARNING}")
        else:
            n = _local_agent_count(args, dep)
            threads = cpu_share.agent_threads(os.cpu_count() or 1, n, args.threads)
            with console.status(f"starting {n} local agents"):
                for i in range(n):  # main thread: children die with this process
                    try:
                        procs.append(
                            local_agents.start_agent(
                                f"agent-{i}",
                                args.devices,
                                threads,
                                extra_args=agent_args,
                                nice=args.agent_nice,
                            )
                        )
                    except RuntimeError as exc:  # e.g. --devices cuda without a GPU
                        return _fail(str(exc))
            refs = [agents.AgentRef(p.agent_id, p.address) for p in procs]
            console.print(transport.describe_mode(tls))
            console.print(f"agents load checkpoints under {agent_args[1]} only")
            for p in procs:
                console.print(
                    f"agent {p.agent_id} at {p.address} ({args.devices}, {threads} threads)"
                )
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            console=console,
        ) as bar:
            task = bar.add_task("applying plan", total=None)

            def progress(result: actuate.Result) -> None:
                bar.update(
                    task,
                    advance=1,
                    description=("✓ " if result.ok else "✗ ") + result.action.describe(),
                )

            outcome = await converge.converge(
                dep,
                model_path,
                refs,
                progress,
                auto,
                on_steps=lambda t: bar.update(task, total=max(1, len(t.steps))),
                rollout=rollout,
                tls=tls,
            )
        if outcome.reason != "Serving" or outcome.plan is None or outcome.routes is None:
            return _fail(f"{outcome.reason}: {outcome.message}")
        port = args.port if args.port is not None else dep.spec.gateway.port
        published = outcome.routes
        leaders = up_report.leaders(outcome)
        gateway = await gw_server.start_gateway(
            gw_config.GatewayConfig(
                model_name=dep.spec.model.name,
                model_path=model_path,
                host=args.host,
                port=port,
                arrival_span_s=args.arrival_span,
                hold=up_autoscale.hold_config(dep.spec),
                generate_mux=args.generate_mux,
                tls=tls,
            )
        )
        # Ready means settled: `/health` answers OK once the routes are applied and polled,
        # so the collector's pass over start-up's objects (hundreds of ms holding this
        # loop, which is the gateway's) comes first, not under the first requests.
        if settle_heap:  # later passes skip all this
            gc_heap.settle("tessera up serving")
        gateway.apply_routes(gw_routes.from_doc(outcome.routes))  # with the class shares
        await gateway.refresh()
        up_report.write_state(args.state_file, dep, refs, gateway.url)
        console.print(
            f"[bold green]serving[/] {dep.spec.model.name}: "
            f"{len(leaders)} replicas ({outcome.plan.source}) at {gateway.url}"
        )
        sys.stdout.write(up_report.curl_example(gateway.url, dep.spec.model.name))
        sys.stdout.flush()
        said = said_overload = ""
        seen: dict[str, str] = {}
        up_report.report_variants(outcome, console.print, seen)

        async def one_pass(current: Any, shared: observation.Observation) -> bool:
            """A converge pass toward `current`, then an overload tick over the pass's own
            observation (`shared`); True while a transition is under way."""
            nonlocal published, said, said_overload
            assert gateway is not None

            async def publish(doc: routes_doc.RoutesDoc, _plan: Any) -> None:
                assert gateway is not None
                gateway.apply_routes(gw_routes.from_doc(doc))  # a cut-over (cutover.py)

            again = await converge.converge(
                current,
                model_path,
                refs,
                auto_planner=auto,
                published=published,
                publish=publish,
                rollout=rollout,
                shared=shared,
                replicas_cap=autoscaler.cap(current) if autoscaler is not None else None,
                tls=tls,
            )
            published = again.routes or published
            if autoscaler is not None and again.plan is not None:
                autoscaler.follow(
                    current, up_report.members(again)
                )  # its replicas, added or removed
            up_report.report_variants(again, console.print, seen)
            if scaling is not None and await scaling.sync(current.spec):  # an edit, now
                shared.acted()  # it evicted layer replicas
            if overload is not None:  # the pass's observation serves the loop's tick
                await overload.tick(shared)
            note = up_policies.overload_note(dep.spec, current.spec) or ""
            if note and note != said_overload:
                console.print(note)
            said_overload = note
            for r in again.results:  # each load says where its parameters came from
                if r.ok and r.action.kind == "LoadBlock":
                    console.print(f"✓ {r.action.describe()}")
            note = f"{again.reason}: {again.message}"
            if again.actions:  # drift repaired, a restarted agent reloaded, or a transition step
                console.print(f"reconciled drift: {len(again.actions)} actions ({note})")
            elif note != said and again.reason != "Serving":
                console.print(note)
            said = note
            remaining = again.remaining
            return remaining is not None and bool(remaining.steps) and remaining.blocked is None

        supervisor = supervise.start(
            procs, args.devices, threads, console.print, agent_args, nice=args.agent_nice
        )
        # one pass at a time: a converge pass, an overload tick and a scaling tick never
        # overlap, and the loops ticked in a pass share its observation of the agents
        deployment = observation.Pass(observation.Observation(refs, tls=tls))
        itl, at = gateway.service.metrics.itl, [(r.name, r.address) for r in refs]
        scaling = up_policies.ScalingPolicy(  # module scaling (issue 15), as the spec says
            lambda spec: scaling_loop.for_up(spec, model_path, at, itl, tls),
            lambda lp: up_policies.run_locked(
                lp, stop, args.scaling_interval, console.print, deployment
            ),
            console.print,
        )
        await scaling.sync(dep.spec)
        watcher = up_watch.ManifestWatcher(
            args.file,
            dep,
            lambda d: [
                *variant_check.check(d, model_path),
                *(_outside_root(d, model_path, agent_args[1]) if procs else []),
            ],
        )
        overload = up_overload.start(dep, outcome, gateway, lambda: published)
        if overload is not None:
            overload_task = loop.create_task(overload.run(stop, deployment, OVERLOAD_TICK_S))
        started = up_autoscale.start(  # replica autoscaling, sleep, zero (issue 32)
            dep, up_report.members(outcome), gateway, stop, deployment.lock, console.print
        )
        if started is not None:
            autoscaler, autoscale_task = started
        wake = [supervisor.restarted] if supervisor is not None else []
        await up_watch.run_loop(
            stop,
            watcher,
            up_overload.guarded(deployment, one_pass),
            console.print,
            args.reconcile_interval,
            args.watch_interval,
            wake=[*wake, *([autoscaler.resized] if autoscaler is not None else [])],
        )
        if overload_task is not None:
            await overload_task
        return 0
    finally:
        console.print("stopping")
        if scaling is not None:
            await scaling.stop()
        if overload_task is not None and not overload_task.done():
            overload_task.cancel()
        if autoscale_task is not None and not autoscale_task.done():
            autoscale_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await autoscale_task
        await supervise.stop(supervisor)
        if gateway is not None:
            await gateway.stop()
        if args.agent and refs:  # leave external agents as we found them
            obs = await agents.observe(refs, tls=tls)
            from tessera import plan as plan_mod

            await actuate.apply(reconcile.delete_actions(obs, plan_mod.owner_prefix(dep)), tls=tls)
        for p in procs:
            local_agents.stop_agent(p)
        with contextlib.suppress(FileNotFoundError):
            args.state_file.unlink()
