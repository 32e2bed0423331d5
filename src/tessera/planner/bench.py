"""Planner benchmark: heterogeneous vs homogeneous layouts, heuristic vs exhaustive, timing.

Run as ``tessera bench planner --json`` (dispatched by ``tessera.cli.bench``). Workload
classes are k-means types of the Azure LLM conversation trace (``tessera.workload``),
mixed in compositions from uniform to highly skewed; clusters are 2x4 and 2x8 H100 with
Llama-2-13B and Llama-2-70B shapes. Every rate comes from the *analytic* cost model
(``tessera.cost.analytic``): the figures are model estimates, not measurements, and the
output says so. Timing fields are wall-clock seconds of one ``search.plan`` call on this
machine (synthetic clusters of 8-GPU nodes for 64/256/1024 GPUs). ``oserve_table1``
(``tessera.planner.table1``) is OServe's Table 1 under the latency-aware objective
(``tessera.planner.latency``): heterogeneous vs best homogeneous P99 latency on the
S1-S5 class mixes, also model output.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tessera import model_facts
from tessera.cost import analytic, model_shape
from tessera.cost.capacity import RequestClass, Slo
from tessera.cost.profile import Profile
from tessera.planner.problem import PlanningProblem, PoolNode

if TYPE_CHECKING:
    from tessera.planner import search

ROOT = Path(__file__).resolve().parents[3]
TRACE = ROOT.parent / "shared/traces/azure_llm_2023_conv.csv"
MODELS: tuple[str, ...] = ("llama-2-13b", "llama-2-70b")
CLUSTERS: tuple[tuple[int, int], ...] = ((2, 4), (2, 8))  # (nodes, GPUs per node)
SCALE_NODES: tuple[int, ...] = (8, 32, 128)  # 64, 256, 1024 GPUs of 8-GPU nodes
SKEWS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 0.9)
QUICK_SKEWS: tuple[float, ...] = (0.0, 0.9)
DEVICE = "h100-80gb"
SLO = Slo(ttft_s=2.0, tpot_s=0.1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Benchmark options."""
    parser.add_argument("--seed", type=int, default=0, help="k-means and search seed")
    parser.add_argument("--k", type=int, default=3, help="workload classes (k-means k)")
    parser.add_argument(
        "--quick", action="store_true", help="two skews, one model at scale (for tests)"
    )
    parser.add_argument("--plot", default="", help="write the skew plot (PNG) here")
    parser.add_argument("--trace", type=Path, default=TRACE, help="Azure conversation trace")


def _classes(trace: Path, k: int, seed: int) -> tuple[RequestClass, ...]:
    from tessera.workload import classes, traces  # the trace reader and k-means typing

    fitted = classes.fit_classes(traces.read_azure_csv(trace), k, seed)
    return tuple(
        RequestClass(f"c{j}", max(1, round(c.input_tokens)), max(1, round(c.output_tokens)))
        for j, c in enumerate(fitted.centroids)
    )


def _profile(name: str) -> Profile:
    config = model_facts.read_config(ROOT / "examples/models" / name)
    return analytic.analytic_profile(model_shape.from_hf_config(config, name), DEVICE)


def _problem(
    profile: Profile, nodes: int, gpus: int, base: tuple[RequestClass, ...], weights: list[float]
) -> PlanningProblem:
    mix = tuple(
        RequestClass(c.name, c.input_tokens, c.output_tokens, w)
        for c, w in zip(base, weights, strict=True)
    )
    pool = tuple(PoolNode(f"node-{i}", tuple(range(gpus))) for i in range(nodes))
    return PlanningProblem(profile, pool, 80 * 2**30, profile.comm, mix, SLO)


def compositions(k: int, skews: tuple[float, ...]) -> list[tuple[float, int, list[float]]]:
    """(skew, dominant class, weights): weight (1-s)/k everywhere plus s on one class."""
    out = []
    for skew in skews:
        dominants = [0] if skew == 0 else list(range(k))
        for dom in dominants:
            weights = [(1 - skew) / k + (skew if j == dom else 0.0) for j in range(k)]
            out.append((skew, dom, weights))
    return out


def _timed(problem: PlanningProblem, options: search.SearchOptions) -> tuple[float, Any]:
    from tessera.planner import search

    began = time.perf_counter()
    plan = search.plan(problem, options)
    return time.perf_counter() - began, plan


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark and return its JSON-able result."""
    from tessera.planner import search  # scipy and networkx: only when the bench runs

    seed, quick = int(args.seed), bool(args.quick)
    base = _classes(args.trace, int(args.k), seed)
    skews = QUICK_SKEWS if quick else SKEWS
    mixes = compositions(len(base), skews)
    profiles = {name: _profile(name) for name in MODELS}
    heuristic = search.SearchOptions(method="heuristic", seed=seed)
    exhaustive = search.SearchOptions(method="exhaustive", seed=seed)
    cases: list[dict[str, Any]] = []
    times: dict[str, list[float]] = {"heuristic_16": [], "exhaustive_16": []}
    for nodes, gpus in CLUSTERS:
        for name, prof in profiles.items():
            for skew, dom, weights in mixes:
                problem = _problem(prof, nodes, gpus, base, weights)
                t_h, plan_h = _timed(problem, heuristic)
                t_e, plan_e = _timed(problem, exhaustive)
                if nodes * gpus == 16:
                    times["heuristic_16"].append(t_h)
                    times["exhaustive_16"].append(t_e)
                homo = dict(plan_h.stats)["homogeneous_scale"] * sum(problem.demand)
                cases.append(
                    {
                        "cluster": f"{nodes}x{gpus}",
                        "model": name,
                        "skew": skew,
                        "dominant_class": dom,
                        "weights": [round(w, 4) for w in weights],
                        "heuristic_rps": plan_h.objective,
                        "exhaustive_rps": plan_e.objective,
                        "homogeneous_rps": homo,
                        "heuristic_replicas": [f"tp{r.tp}pp{r.pp}" for r in plan_h.replicas],
                    }
                )
    scale_models = MODELS[:1] if quick else MODELS
    scale_times: dict[str, float] = {}
    for nodes in SCALE_NODES:
        worst = 0.0
        for name in scale_models:
            problem = _problem(profiles[name], nodes, 8, base, [1.0 / len(base)] * len(base))
            worst = max(worst, _timed(problem, heuristic)[0])
        scale_times[f"plan_s_{nodes * 8}"] = worst
    vs_exh = [c["heuristic_rps"] / c["exhaustive_rps"] for c in cases if c["exhaustive_rps"] > 0]
    vs_homo = [c["heuristic_rps"] / c["homogeneous_rps"] for c in cases if c["homogeneous_rps"] > 0]
    result: dict[str, Any] = {
        "profile_source": "analytic",
        "note": "simulated: throughput from the analytic cost model (datasheet peaks x stated "
        "efficiency factors), not measured on GPUs",
        "setup": {
            "device": DEVICE,
            "clusters": [f"{n}x{g}" for n, g in CLUSTERS],
            "models": list(MODELS),
            "slo": {"ttft_p99_s": SLO.ttft_s, "tpot_p99_s": SLO.tpot_s},
            "trace": args.trace.name,
            "classes": [
                {"name": c.name, "input_tokens": c.input_tokens, "output_tokens": c.output_tokens}
                for c in base
            ],
            "skews": list(skews),
            "seed": seed,
            "throughput": "sustainable req/s at the composition's class mix",
        },
        "heuristic_vs_exhaustive_min": min(vs_exh),
        "heuristic_vs_exhaustive_mean": statistics.fmean(vs_exh),
        "hetero_vs_homo_mean": statistics.fmean(vs_homo),
        "hetero_vs_homo_max": max(vs_homo),
        "exhaustive_s_16": statistics.fmean(times["exhaustive_16"]),
        "heuristic_s_16": statistics.fmean(times["heuristic_16"]),
        **scale_times,
        "cases": cases,
    }
    from tessera.planner import table1
    from tessera.workload import traces

    result["oserve_table1"] = table1.run(
        profiles["llama-2-70b"],
        table1.quadrant_classes(traces.read_azure_csv(args.trace)),
        SLO,
        quick=quick,
    )
    if args.plot:
        from tessera.planner import bench_plot

        labels = [f"{c.name} ({c.input_tokens}/{c.output_tokens} tok)" for c in base]
        bench_plot.plot_skew(cases, args.plot, labels)
        result["plot"] = str(args.plot)
    return result
