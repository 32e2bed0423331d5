"""Adaptive benchmark: predictive switching vs the best static layout on local agents (Proof 2).

`tessera bench adaptive --json [--spans N] [--span S] [--phase-spans P] [--rate R]`. A
time-compressed replay of the shared trace, typed into two k-means classes, whose mix shifts
every P spans between `--low-share` and `--high-share` of the long-prompt class (calibration
and replay use disjoint requests). One `tessera up` (2 local agents, tiny llama) serves it all,
layouts changed by rewriting its manifest: calibration (each layout of
`bench_relayout.LAYOUTS[:2]` at each mix: the cost table `price` interpolates, and the switch
time); static (each layout over the replay; the best P99 with hindsight); adaptive (the loop's
pure step, `policies.switching_step`, after each gateway span, in active mode) and
`adaptive_from_other` (started on the other layout). Keys: `p99_latency_ratio` (best static /
adaptive, > 1: switching won), `throughput_ratio`, `switches`, `lost`, `tokens_match`,
`forecast_rrmse`, the calibration table, and `model_output` (`bench_adaptive_model`, labelled
as model output). With 0 switches the ratio is run-to-run noise; docs/switching.md.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tessera.bench import harness, local_up, options, oracle, trace
from tessera.cli import bench_relayout
from tessera.cli.bench_adaptive_replay import (
    CANDIDATES,
    Req,
    Server,
    Workload,
    make_spans,
    phase_shares,
    summary,
    write_manifest,
)
from tessera.cli.bench_adaptive_replay import _copy as copy_reqs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spans", type=int, default=12, help="spans in the replay")
    parser.add_argument("--span", type=float, default=4.0, help="span length (s)")
    parser.add_argument("--phase-spans", type=int, default=4, help="spans per mix phase")
    options.add_rate(parser, 2.0)
    parser.add_argument("--low-share", type=float, default=0.1)
    parser.add_argument("--high-share", type=float, default=0.9)
    parser.add_argument("--calib-spans", type=int, default=2)
    trace.add_arguments(parser, max_input=256, max_output=48)
    parser.add_argument("--min-gain", type=float, default=0.1)
    parser.add_argument("--drain-deadline", type=float, default=2.0)
    options.add_seed(parser)
    parser.add_argument(
        "--reference", type=int, default=48, help="requests compared with transformers (0: none)"
    )
    parser.add_argument("--no-model", action="store_true", help="skip the model-output part")


def _note(msg: str) -> None:
    harness.note("adaptive", msg)


# -- the loop ---------------------------------------------------------------------------
@dataclass
class Calibration:
    """Measured P99 latency of each layout at the low and the high long-class share."""

    p99: dict[int, tuple[float, float]]  # layout -> (at low share, at high share)
    low: float
    high: float
    switch_s: float  # measured transition time (the larger direction)

    def price(self, name: str, demand: tuple[float, ...]) -> float:
        lo, hi = self.p99[int(name)]
        total = sum(demand)
        share = demand[1] / total if total > 0 else self.low
        x = min(1.0, max(0.0, (share - self.low) / (self.high - self.low)))
        value = lo + x * (hi - lo)
        return value if math.isfinite(value) and value > 0 else math.inf


@dataclass
class LoopLog:
    steps: list[dict[str, Any]]
    forecasts: dict[int, tuple[float, ...]]  # gateway span index -> the loop's forecast
    switch_s: list[float]
    first_span: int = 0
    history: list[list[float]] | None = None
    start: int = 0  # the layout the run started on
    switch_at: list[float] = field(default_factory=list)  # perf_counter of each switch


async def drive_loop(
    server: Server, cal: Calibration, args: argparse.Namespace, t0: float, log: LoopLog
) -> None:
    """Each gateway span: read arrivals, step the loop (active), switch on its word."""
    from tessera.policies.switching import gain as switching
    from tessera.policies.switching import step as switching_step

    config = switching.SwitchingConfig(True, "active", args.span, args.min_gain)
    state = switching.HysteresisState()
    end = t0 + args.spans * args.span
    switching_task: asyncio.Task[float] | None = None
    while time.perf_counter() < end:
        snap = await server.get("/admin/v1/arrivals")
        await asyncio.sleep(max(0.0, args.span - snap["currentElapsedSeconds"]) + 0.05)
        snap = await server.get("/admin/v1/arrivals")
        index = snap["firstSpan"] + len(snap["spans"])  # the span now being counted
        history = snap["spans"][max(0, len(snap["spans"]) - (index - log.first_span)) :]
        if not history:
            continue
        if switching_task is not None and not switching_task.done():
            log.steps.append({"span": index, "skipped": "a switch is still running"})
            continue
        if switching_task is not None:
            log.switch_s.append(switching_task.result())
            switching_task = None
        s = switching_step.step(
            config,
            state,
            history,
            str(server.layout),
            [str(c) for c in CANDIDATES],
            cal.price,
            lambda a, b: cal.switch_s,
        )
        state = s.state
        log.forecasts[index] = s.forecast.counts
        log.steps.append({"span": index, **s.to_json()})
        if s.decision.action == switching.SWITCH:
            _note(f"span {index}: switch to {s.decision.candidate}: {s.decision.reason}")
            log.switch_at.append(time.perf_counter())
            switching_task = asyncio.get_running_loop().create_task(
                server.switch(int(s.decision.candidate))
            )
    if switching_task is not None:
        log.switch_s.append(await switching_task)


def forecast_quality(history: list[list[float]], log: LoopLog) -> dict[str, Any]:
    """Pooled one-step RRMSE over the run's spans from the third on: each method forecasts
    span t fitted on spans before t only (as the loop would with that method alone); and
    of the loop's own (selected) forecasts."""
    from tessera.policies.switching import step as switching_step
    from tessera.workload import rrmse

    h = np.asarray(history, dtype=np.float64)
    out: dict[str, Any] = {"spans": len(h)}
    if len(h) < 4:
        return out
    for name in switching_step.default_methods():
        pred = []
        for t in range(2, len(h)):
            model = switching_step.default_methods()[name]
            model.fit(h[:t])
            pred.append(model.predict(h[:t]))
        out[name] = round(rrmse.overall(h[2:], np.asarray(pred)), 4)
    pairs = [
        (h[i - log.first_span], np.asarray(f))
        for i, f in log.forecasts.items()
        if 0 <= i - log.first_span < len(h)
    ]
    if pairs:
        out["selected"] = round(
            rrmse.overall(np.asarray([a for a, _ in pairs]), np.asarray([p for _, p in pairs])),
            4,
        )
    return out


# -- the benchmark ----------------------------------------------------------------------
async def _calibrate(
    server: Server, w: Workload, args: argparse.Namespace, rng: random.Random
) -> tuple[Calibration, dict[str, Any]]:
    """Each layout at the low then the high share, switching between them (measured)."""
    p99: dict[int, tuple[float, float]] = {}
    table: dict[str, Any] = {}
    switches = []
    for i, layout in enumerate(CANDIDATES):
        if i:
            switches.append(await server.switch(layout))
        at = []
        for share in (args.low_share, args.high_share):
            reqs = make_spans(w, [share] * args.calib_spans, args, rng)
            await server.replay(reqs)
            got = summary(reqs)
            at.append(got["p99_latency_s"])
            table[f"{bench_relayout.LAYOUTS[layout][0]} @ long share {share}"] = got
        p99[layout] = (at[0], at[1])
        _note(f"calibrated {bench_relayout.LAYOUTS[layout][0]}: p99 {at}")
    switches.append(await server.switch(CANDIDATES[0]))
    cal = Calibration(p99, args.low_share, args.high_share, max(switches))
    return cal, {"runs": table, "switch_s": [round(s, 3) for s in switches]}


async def _bench(args: argparse.Namespace, url: str, path: Path, model: Path, w: Workload) -> Any:
    import aiohttp

    rng = random.Random(args.seed)
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        server = Server(url, path, model, w, session)
        cal, calib = await _calibrate(server, w, args, rng)
        replay = make_spans(w, phase_shares(args, args.spans), args, rng)
        static: dict[int, list[Req]] = {}
        for layout in reversed(CANDIDATES):  # ends on the first layout, where adaptive starts
            if server.layout != layout:
                await server.switch(layout)
            static[layout] = copy_reqs(replay)
            await server.replay(static[layout])
            _note(f"static {bench_relayout.LAYOUTS[layout][0]}: {summary(static[layout])}")
        first = min(CANDIDATES, key=lambda k: cal.p99[k][0])  # best at the first phase's mix
        runs = {}
        for label, start in (("adaptive", first), ("adaptive_from_other", 1 - first)):
            runs[label] = await _adaptive(server, cal, args, replay, start)
            reqs, log = runs[label]
            _note(f"{label}: {summary(reqs)}; {len(log.switch_s)} switches")
        return cal, calib, static, runs


async def _adaptive(
    server: Server, cal: Calibration, args: argparse.Namespace, replay: list[Req], start: int
) -> tuple[list[Req], LoopLog]:
    """The replay with the loop switching, from layout `start`."""
    if server.layout != start:
        await server.switch(start)
    reqs = copy_reqs(replay)
    log = LoopLog([], {}, [], start=start)
    snap = await server.get("/admin/v1/arrivals")
    log.first_span = snap["firstSpan"] + len(snap["spans"]) + 1  # the first whole span

    async def alongside(t0: float) -> None:
        await drive_loop(server, cal, args, t0, log)

    await server.replay(reqs, alongside)
    snap = await server.get("/admin/v1/arrivals")
    index = snap["firstSpan"] + len(snap["spans"])
    log.history = snap["spans"][len(snap["spans"]) - (index - log.first_span) :]
    return reqs, log


def _compact(log: LoopLog) -> list[dict[str, Any]]:
    """Per loop step: the span, the forecast method and counts, the action and why."""
    out = []
    for st in log.steps:
        if "skipped" in st:
            out.append({"span": st["span"], "skipped": st["skipped"]})
            continue
        d = st["lastDecision"]
        out.append(
            {
                "span": st["span"],
                "current": st["current"],
                "method": st["forecast"]["method"],
                "forecast": st["forecast"]["counts"],
                "action": d["action"],
                "candidate": d["candidate"],
                "reason": d["reason"],
            }
        )
    return out


def _around_switches(
    runs: dict[str, tuple[list[Req], LoopLog]], args: argparse.Namespace
) -> list[Req]:
    """The completed adaptive requests nearest a switch (sent closest to it), then the
    others in order, `args.reference` in all: HF decoding on a busy CPU is slow."""
    done: list[tuple[float, int, Req]] = []
    for reqs, log in runs.values():
        at = log.switch_at
        for i, r in enumerate(reqs):
            if r.done and not r.error:
                near = min((abs(r.sent - t) for t in at), default=math.inf)
                done.append((near, i, r))
    done.sort(key=lambda x: (x[0], x[1]))
    return [r for _, _, r in done[: max(0, args.reference)]]


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.spans < 2 or args.phase_spans < 1 or not args.span > 0 or not args.rate > 0:
        raise SystemExit(
            "tessera bench adaptive: need --spans >= 2, --phase-spans >= 1, "
            "--span > 0 and --rate > 0"
        )
    w = Workload(args)
    with tempfile.TemporaryDirectory(prefix="tessera-adaptive-") as tmp:
        model = local_up.make_tiny(Path(tmp) / "tiny-llama")
        path = Path(tmp) / "m.yaml"
        write_manifest(path, model, CANDIDATES[0], w)
        flags = ["--drain-deadline", str(args.drain_deadline), "--watch-interval", "0.2"]
        flags += ["--arrival-span", str(args.span)]
        with local_up.Up(path, *flags, what="adaptive") as up:
            _note(f"serving at {up.url}")
            cal, calib, static, adaptive_runs = asyncio.run(_bench(args, up.url, path, model, w))
        matches = oracle.matches(model, _around_switches(adaptive_runs, args))
    adaptive, log = adaptive_runs["adaptive"]
    other, other_log = adaptive_runs["adaptive_from_other"]
    model_output = None
    if not args.no_model:
        from tessera.cli import bench_adaptive_model

        _note("model output (GPU candidates, analytic cost model)")
        model_output = bench_adaptive_model.run(args, phase_shares(args, args.spans))
    runs = {bench_relayout.LAYOUTS[k][0]: summary(v) for k, v in static.items()}
    best_name = min(runs, key=lambda k: runs[k]["p99_latency_s"])
    best, ad, ot = runs[best_name], summary(adaptive), summary(other)
    lost = [r for r in adaptive if not (r.done and not r.error)]
    lost_other = [r for r in other if not (r.done and not r.error)]
    return {
        "p99_latency_ratio": round(best["p99_latency_s"] / ad["p99_latency_s"], 4),
        "throughput_ratio": round(ad["tokens_per_s"] / best["tokens_per_s"], 4),
        "switches": len(log.switch_s),
        "switch_s": [round(s, 3) for s in log.switch_s],
        "lost": len(lost),
        "lost_examples": [r.error or "stream ended early" for r in lost[:5]],
        "adaptive_start": bench_relayout.LAYOUTS[int(log.start)][0],
        "adaptive_from_other": {
            "start": bench_relayout.LAYOUTS[int(other_log.start)][0],
            "p99_latency_ratio": round(best["p99_latency_s"] / ot["p99_latency_s"], 4),
            "throughput_ratio": round(ot["tokens_per_s"] / best["tokens_per_s"], 4),
            "switches": len(other_log.switch_s),
            "switch_s": [round(s, 3) for s in other_log.switch_s],
            "lost": len(lost_other),
            "run": ot,
            "loop": _compact(other_log),
        },
        "tokens_match": (bool(matches) and all(matches)) if args.reference else None,
        "tokens_compared": len(matches),
        "forecast_rrmse": forecast_quality(log.history or [], log),
        "model_output": model_output,
        "best_static": best_name,
        "static": runs,
        "adaptive": ad,
        "calibration": {
            **calib,
            "p99_by_layout": {
                bench_relayout.LAYOUTS[k][0]: {"low_share": v[0], "high_share": v[1]}
                for k, v in cal.p99.items()
            },
        },
        "loop": _compact(log),
        "arrivals_recorded": log.history,
        "classes": {n: list(c) for n, c in zip(w.names, w.centroids, strict=True)},
        "replay": {
            "spans": args.spans,
            "span_s": args.span,
            "phase_spans": args.phase_spans,
            "rate_rps": args.rate,
            "long_share_by_span": phase_shares(args, args.spans),
            "requests": len(adaptive),
        },
        "trace": str(args.trace),
        "machine": harness.machine("shared with other work"),
        "setup": "tessera up, 2 local agents (cpu:1x2GiB), tiny llama (8 layers), greedy, "
        "ignore_eos; layouts: " + " | ".join(bench_relayout.LAYOUTS[k][0] for k in CANDIDATES),
    }
