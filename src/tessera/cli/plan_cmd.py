"""`tessera plan`: plan a deployment from a manifest, or solve a bare class assignment.

* ``tessera plan -f MANIFEST --cluster CLUSTER.yaml [--profile P] [--json]`` prints the
  replicas (GPUs, tp, pp, layer range per stage) and each class's routing shares.
* ``tessera plan assign --input FILE.json [--objective throughput|makespan]`` prints the
  exact LP assignment with its optimality certificate as JSON.

Thin shell: reads files, calls ``tessera.planner`` (pure) and prints. Malformed inputs
are reported as ``tessera plan: error: FIELD: reason`` with exit code 1. The planner (scipy,
networkx) is imported when a command runs, so ``tessera --help`` stays light.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tessera import fields
from tessera.cli import input_files

if TYPE_CHECKING:
    from tessera.planner.cluster import Cluster
    from tessera.planner.deployment import Deployment

# Kept equal to search.METHODS and assign.OBJECTIVES (a test checks) so that building the
# parser does not import scipy.
METHODS: tuple[str, ...] = ("heuristic", "exhaustive", "homogeneous")
OBJECTIVES: tuple[str, ...] = ("throughput", "makespan")


def register(sub: Any) -> None:
    """Add the ``plan`` command (and its ``assign`` subcommand) to ``sub``."""
    parser = sub.add_parser(
        "plan",
        help="plan replicas (GPUs, tp, pp, stages) and per-class routing shares",
        description="Plan a deployment for a ServingDeployment manifest on a cluster.",
    )
    parser.add_argument("-f", "--filename", dest="manifest", help="ServingDeployment YAML")
    parser.add_argument("--cluster", help="cluster YAML (see docs/planner.md)")
    parser.add_argument(
        "--profile", help="cost profile JSON (default: analytic profile of the cluster's GPU)"
    )
    parser.add_argument("--json", action="store_true", help="print the deployment as JSON")
    parser.add_argument("--svg", help="also draw the layout to this SVG file")
    parser.add_argument("--method", choices=METHODS, default="heuristic")
    parser.add_argument("--seed", type=int, default=0, help="search seed (default 0)")
    parser.set_defaults(func=run_plan)
    commands = parser.add_subparsers(dest="plan_command", metavar="SUBCOMMAND", required=False)
    assign_parser = commands.add_parser(
        "assign", help="solve the class-to-replica assignment LP for given capacities"
    )
    assign_parser.add_argument("--input", required=True, help="assignment input JSON")
    assign_parser.add_argument("--objective", choices=OBJECTIVES, default="throughput")
    assign_parser.set_defaults(func=run_assign)


def _fail(message: str) -> int:
    sys.stderr.write(f"tessera plan: error: {message}\n")
    return 1


def run_assign(args: argparse.Namespace) -> int:
    """``tessera plan assign``: print the LP assignment and its certificate."""
    from tessera.planner import assign, assign_input

    try:
        data = assign_input.parse(input_files.read_json(args.input, "--input"))
        result = assign.solve(data.problem, args.objective)
    except (fields.FieldError, assign.InfeasibleError) as exc:
        return _fail(str(exc))
    sys.stdout.write(json.dumps(assign_input.result_json(data, result), indent=2) + "\n")
    return 0


def _gpu_type(spec: Cluster) -> str:
    """The GPU type with the most GPUs in the cluster."""
    totals: dict[str, int] = {}
    for node in spec.nodes:
        if node.gpus > 0:
            totals[node.gpu_type] = totals.get(node.gpu_type, 0) + node.gpus
    if not totals:
        raise fields.FieldError("spec.nodes", "the cluster has no GPU node")
    return max(sorted(totals), key=lambda t: totals[t])


def run_plan(args: argparse.Namespace) -> int:
    """``tessera plan -f MANIFEST --cluster CLUSTER``: print the planned deployment."""
    if not args.manifest or not args.cluster:
        return _fail("-f MANIFEST and --cluster CLUSTER.yaml are required (or use: plan assign)")
    from tessera.cost import analytic, profile
    from tessera.planner import cluster, deployment_check, manifest, search
    from tessera.planner import problem as problem_mod

    try:
        doc = input_files.read_yaml(args.manifest, "-f")
        inputs = manifest.planner_inputs_from_manifest(doc, Path(args.manifest).parent)
        spec = cluster.cluster_from_doc(input_files.read_yaml(args.cluster, "--cluster"))
        if args.profile:
            prof = profile.profile_from_json(input_files.read_json(args.profile, "--profile"))
        else:
            prof = analytic.analytic_profile(inputs.model, _gpu_type(spec))
        planning = problem_mod.build_problem(inputs, spec, prof)
        plan = search.plan(planning, search.SearchOptions(method=args.method, seed=args.seed))
    except (fields.FieldError, ValueError) as exc:
        return _fail(str(exc))
    problems = deployment_check.violations(plan, planning)
    if problems:
        return _fail("planner produced an invalid deployment: " + "; ".join(problems))
    if getattr(args, "svg", None):
        _write_svg(args.svg, plan, inputs.model.num_layers)
    if args.json:
        sys.stdout.write(json.dumps(plan.to_json(), indent=2) + "\n")
    else:
        sys.stdout.write(format_plan(plan))
    return 0


def _write_svg(path: str, plan: Deployment, num_layers: int) -> None:
    """The layout picture the gateway's status page draws (docs/observability.md)."""
    from tessera.observability import layout_svg

    picture = layout_svg.from_deployment(plan, num_layers)
    Path(path).write_text(layout_svg.render(picture, layout_svg.deployment_shares(plan)))


def format_plan(plan: Deployment) -> str:
    """Human-readable table of a deployment."""
    gpus = sum(len(r.gpus) for r in plan.replicas)
    source = plan.profile_source
    note = " (model estimates, not measurements)" if source == "analytic" else ""
    demand = sum(plan.demand)
    lines = [
        f"deployment of {plan.model} on {gpus} x {plan.device} "
        f"[profile: {source}{note}; method: {plan.method}]",
        f"sustainable rate at this class mix: {plan.objective:.2f} req/s "
        f"({plan.scale:.2f} x the planned {demand:.2f} req/s)",
        "",
        f"{'replica':<8} {'tp':>2} {'pp':>2} {'util':>5}  stages (layers @ node:gpus)",
    ]
    for k, replica in enumerate(plan.replicas):
        stages = " | ".join(
            f"[{s.layers[0]},{s.layers[1]}) @ {s.gpus[0][0]}:" + ",".join(str(i) for _, i in s.gpus)
            for s in replica.stages
        )
        util = plan.utilization[k]
        lines.append(f"{replica.name:<8} {replica.tp:>2} {replica.pp:>2} {util:>5.2f}  {stages}")
    lines += ["", "routing shares (fraction of each class's requests per replica):"]
    header = f"{'replica':<8} " + " ".join(f"{name:>10}" for name in plan.classes)
    lines.append(header)
    for k, replica in enumerate(plan.replicas):
        lines.append(f"{replica.name:<8} " + " ".join(f"{v:>10.3f}" for v in plan.shares[k]))
    if plan.unservable:
        lines.append("")
        lines.append("classes no replica can serve within the SLO: " + ", ".join(plan.unservable))
    return "\n".join(lines) + "\n"
