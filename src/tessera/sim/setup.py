"""Build a simulated cluster: replicas from the real planner's deployment (or a uniform
layout), KV pools from the memory model, and the real router with the plan's class shares.

Input: a `ServingDeployment` manifest and a cluster file (the planner's formats,
`tessera.planner.manifest` and `tessera.planner.cluster`), a cost profile (analytic, or
measured with `tessera profile`). Output: `SimReplica`s and a configured `Router`.
Called by the CLI (`tessera sim`) and the bench.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tessera.cost.capacity import RequestClass
from tessera.cost.latency import StageSpec, stage_param_bytes
from tessera.cost.profile import CommSpec, Profile
from tessera.planner import cluster as cluster_mod
from tessera.planner import manifest, problem, search
from tessera.planner.deployment import Deployment, ReplicaPlan
from tessera.policies.routing.shares import Router, centroid_class_router
from tessera.policies.serving import batching
from tessera.sim.replica import SimReplica
from tessera.sim.steptime import StepModel

PAGE_SIZE = 16  # tokens per KV page (the agent's default)
MEMORY_UTILIZATION = 0.9  # share of HBM the engine may use (weights + KV)
DEFAULT_LIMITS = batching.BatchLimits()  # the agent scheduler's defaults


def kv_pages(
    profile: Profile,
    stages: Sequence[StageSpec],
    tp: int,
    gpu_memory: int,
    page_size: int = PAGE_SIZE,
    utilization: float = MEMORY_UTILIZATION,
) -> int:
    """Pages of the replica's KV pool: every stage holds every token's K/V for its layers,
    so the pool is the smallest stage's (usable HBM minus its weights) / page bytes."""
    pages = None
    for s in stages:
        free = utilization * gpu_memory * tp - stage_param_bytes(profile, s)
        per_page = profile.memory.kv_bytes_per_token * max(1, s.layers) * page_size
        n = int(free // per_page)
        pages = n if pages is None else min(pages, n)
    if not pages or pages < 1:
        raise ValueError("the model does not fit this layout's memory (no KV page left)")
    return pages


def page_bytes(profile: Profile, layers: int, page_size: int = PAGE_SIZE) -> int:
    """Bytes of one page across all layers of the model (the overload policy's unit)."""
    return profile.memory.kv_bytes_per_token * layers * page_size


def make_replica(
    name: str,
    profile: Profile,
    comm: CommSpec,
    tp: int,
    layer_runs: Sequence[int],
    cross_node: Sequence[bool],
    gpu_memory: int,
    limits: batching.BatchLimits = DEFAULT_LIMITS,
) -> SimReplica:
    """A replica of `len(layer_runs)` stages holding those many layers each; hop i uses
    the inter-node link when `cross_node[i]`."""
    pp = len(layer_runs)
    stages = [
        StageSpec(
            layers=n,
            first=i == 0,
            last=i == pp - 1,
            hop=None if i == pp - 1 else (comm.inter_node if cross_node[i] else comm.intra_node),
        )
        for i, n in enumerate(layer_runs)
    ]
    model = StepModel(profile, stages, tp, comm.intra_node)
    pages = kv_pages(profile, stages, tp, gpu_memory)
    return SimReplica(
        name, model, pages, PAGE_SIZE, page_bytes(profile, profile.model.num_layers), limits
    )


def uniform(
    profile: Profile,
    comm: CommSpec,
    gpus: int,
    tp: int,
    pp: int,
    gpus_per_node: int,
    gpu_memory: int,
    limits: batching.BatchLimits = DEFAULT_LIMITS,
) -> list[SimReplica]:
    """`gpus // (tp*pp)` identical replicas, stages split evenly, packed onto nodes."""
    L = profile.model.num_layers
    runs = [L // pp + (1 if i < L % pp else 0) for i in range(pp)]
    per_node = max(1, gpus_per_node // tp)  # stages per node
    cross = [(i + 1) % per_node == 0 for i in range(pp)]
    return [
        make_replica(f"r{k}", profile, comm, tp, runs, cross, gpu_memory, limits)
        for k in range(gpus // (tp * pp))
    ]


def from_plan(
    plan: Deployment,
    profile: Profile,
    comm: CommSpec,
    gpu_memory: int,
    limits: batching.BatchLimits = DEFAULT_LIMITS,
) -> list[SimReplica]:
    """One simulated replica per planned replica, with its stages and hops."""
    out = []
    for rp in plan.replicas:
        out.append(
            make_replica(rp.name, profile, comm, rp.tp, _runs(rp), _cross(rp), gpu_memory, limits)
        )
    return out


def _runs(rp: ReplicaPlan) -> list[int]:
    return [s.layers[1] - s.layers[0] for s in rp.stages]


def _cross(rp: ReplicaPlan) -> list[bool]:
    nodes = [s.gpus[0][0] for s in rp.stages]
    return [nodes[i] != nodes[i + 1] for i in range(len(nodes) - 1)] + [False]


def router_for(plan: Deployment | None, classes: Sequence[RequestClass], seed: int = 0) -> Router:
    """The gateway's router; with a plan, its class shares and a centroid classifier."""
    router = Router(seed)
    if plan is not None and len(plan.classes) > 1:
        shares = {name: plan.class_shares(name) for name in plan.classes}
        cents = {c.name: (float(c.input_tokens), float(c.output_tokens)) for c in classes}
        router.set_class_shares(shares, centroid_class_router(cents))
    return router


@dataclasses.dataclass(frozen=True)
class Planned:
    plan: Deployment
    inputs: manifest.PlannerInputs
    cluster: cluster_mod.Cluster
    problem: problem.PlanningProblem


def plan_from_files(
    manifest_doc: Any,
    base_dir: Path,
    cluster_doc: Any,
    profile: Profile | None,
    gpus: int | None = None,
) -> Planned:
    """Run the real planner on a manifest and cluster file (`gpus`: override the budget;
    default: every GPU of the cluster's main type)."""
    from tessera.cost import analytic

    inputs = manifest.planner_inputs_from_manifest(manifest_doc, base_dir)
    spec = cluster_mod.cluster_from_doc(cluster_doc)
    main = max(
        {n.gpu_type for n in spec.nodes if n.gpus},
        key=lambda t: sum(n.gpus for n in spec.nodes if n.gpu_type == t),
    )
    total = sum(n.gpus for n in spec.nodes if n.gpu_type == main)
    budget = gpus or total
    inputs = dataclasses.replace(inputs, gpus=budget, max_gpus=max(budget, inputs.max_gpus))
    prof = profile if profile is not None else analytic.analytic_profile(inputs.model, main)
    planning = problem.build_problem(inputs, spec, prof)
    plan = search.plan(planning, search.SearchOptions(method="heuristic"))
    return Planned(plan, inputs, spec, planning)
