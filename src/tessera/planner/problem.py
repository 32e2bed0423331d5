"""A planning problem: the model's profile, the GPUs available, the workload and the SLO.

Built once at the entry point (the CLI, the operator's reconcile core, the benchmark) by
:func:`build_problem` and passed down to ``tessera.planner.search`` and friends.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tessera import fields
from tessera.cost.capacity import CapacityOptions, RequestClass, Slo
from tessera.cost.profile import CommSpec, Profile
from tessera.planner.cluster import Cluster
from tessera.planner.manifest import PlannerInputs


@dataclass(frozen=True)
class PoolNode:
    """A node's GPUs the plan may use."""

    name: str
    gpus: tuple[int, ...]  # GPU indices on that node

    def __post_init__(self) -> None:
        if not self.gpus:
            raise fields.FieldError("gpus", f"node {self.name!r} contributes no GPU")


@dataclass(frozen=True)
class PlanningProblem:
    """Inputs of the deployment search."""

    profile: Profile
    nodes: tuple[PoolNode, ...]  # GPUs to plan with, all of ``profile.device`` type
    gpu_memory_bytes: int  # usable HBM per GPU
    comm: CommSpec  # effective links (cluster figures over the profile's defaults)
    classes: tuple[RequestClass, ...]  # demand is each class's ``rate``
    slo: Slo
    capacity_options: CapacityOptions = dataclasses.field(default_factory=CapacityOptions)
    max_pp: int = 16  # longest pipeline considered
    max_tp: int = 0  # largest TP degree the engine runs (0: up to the node size)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise fields.FieldError("nodes", "no GPU to plan with")
        if not self.classes:
            raise fields.FieldError("classes", "at least one workload class is required")
        if self.gpu_memory_bytes < 1:
            raise fields.FieldError("gpu_memory_bytes", "must be >= 1")
        if self.max_pp < 1:
            raise fields.FieldError("max_pp", "must be >= 1")

    @property
    def demand(self) -> tuple[float, ...]:
        """Per-class rates; an all-zero workload is read as an even mix of 1 req/s each."""
        rates = tuple(c.rate for c in self.classes)
        return rates if any(r > 0 for r in rates) else tuple(1.0 for _ in rates)

    @property
    def total_gpus(self) -> int:
        """GPUs in the pool."""
        return sum(len(n.gpus) for n in self.nodes)


def _same_shape(a: object, b: object) -> bool:
    da, db = dict(vars(a)), dict(vars(b))
    da.pop("name", None)
    db.pop("name", None)
    return da == db


def build_problem(
    inputs: PlannerInputs,
    cluster: Cluster,
    profile: Profile,
    capacity_options: CapacityOptions | None = None,
    max_pp: int = 16,
) -> PlanningProblem:
    """Combine manifest inputs, cluster and profile; take the first ``inputs.gpus`` GPUs of
    the profile's device type in cluster order."""
    if not _same_shape(inputs.model, profile.model):
        raise fields.FieldError(
            "profile.model",
            f"profile is for {profile.model.name!r}, whose shape differs from the manifest's "
            f"model {inputs.model.name!r}",
        )
    candidates = cluster.gpu_nodes(profile.device)
    if not candidates:
        types = sorted({n.gpu_type for n in cluster.nodes})
        raise fields.FieldError(
            "spec.nodes",
            f"no node has gpuType {profile.device!r} (the profile's device); found {types}",
        )
    remaining = inputs.gpus
    nodes: list[PoolNode] = []
    memory = min(n.gpu_memory_bytes for n in candidates)
    for node in candidates:
        if remaining <= 0:
            break
        take = min(node.gpus, remaining)
        nodes.append(PoolNode(node.name, tuple(range(take))))
        remaining -= take
    if inputs.gpu_memory_bytes is not None:
        memory = min(memory, inputs.gpu_memory_bytes)
    return PlanningProblem(
        profile=profile,
        nodes=tuple(nodes),
        gpu_memory_bytes=memory,
        comm=cluster.interconnect.comm(profile.comm),
        classes=inputs.classes,
        slo=inputs.slo,
        capacity_options=capacity_options or CapacityOptions(),
        max_pp=max_pp,
    )
