"""The cluster description the planner places replicas on (``--cluster CLUSTER.yaml``).

Format (docs/planner.md, "Cluster file", has every field)::

    kind: Cluster
    metadata: {name: 2x8-h100}
    spec:
      interconnect: {intraNodeGBps: 450, interNodeGBps: 50, efficiency: 0.7}  # optional
      nodes:
        - {name: gpu-0, gpus: 8, gpuType: h100-80gb, gpuMemory: 80Gi}

Absent interconnect figures come from the profile; ``gpuType: cpu`` nodes (``gpus: 0``)
are ignored. The CLI decodes the YAML and calls :func:`cluster_from_doc`; errors name the
field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tessera import fields
from tessera.cost.profile import CommSpec, Link


@dataclass(frozen=True)
class Node:
    """One machine."""

    name: str
    gpus: int  # accelerators on the node (0 for a CPU node)
    gpu_type: str  # e.g. "h100-80gb", "a100-80gb", "cpu"
    gpu_memory_bytes: int  # HBM per GPU (0 for a CPU node)

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise fields.FieldError("gpus", "must be >= 0")
        if self.gpus and self.gpu_memory_bytes <= 0:
            raise fields.FieldError("gpuMemory", "must be > 0 on a GPU node")


@dataclass(frozen=True)
class Interconnect:
    """Optional link figures (nominal); None means "take the profile's"."""

    intra_gbps: float | None = None
    intra_latency_us: float | None = None
    inter_gbps: float | None = None
    inter_latency_us: float | None = None
    efficiency: float = 0.7  # NCCL bus bandwidth / nominal

    def __post_init__(self) -> None:
        if not 0 < self.efficiency <= 1:
            raise fields.FieldError("efficiency", "must be in (0, 1]")

    def comm(self, default: CommSpec) -> CommSpec:
        """Return ``default`` with every figure given here substituted (made effective)."""

        def link(base: Link, gbps: float | None, latency_us: float | None) -> Link:
            bandwidth = base.bandwidth_bytes_per_s if gbps is None else gbps * 1e9 * self.efficiency
            lat = base.latency_s if latency_us is None else latency_us * 1e-6
            return Link(bandwidth, lat)

        return CommSpec(
            intra_node=link(default.intra_node, self.intra_gbps, self.intra_latency_us),
            inter_node=link(default.inter_node, self.inter_gbps, self.inter_latency_us),
            allreduce_per_layer=default.allreduce_per_layer,
        )


@dataclass(frozen=True)
class Cluster:
    """Nodes and interconnect."""

    name: str
    nodes: tuple[Node, ...]
    interconnect: Interconnect

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise fields.FieldError(f"spec.nodes[{i}].name", f"duplicate node name {name!r}")

    def gpu_nodes(self, gpu_type: str) -> tuple[Node, ...]:
        """Nodes carrying GPUs of ``gpu_type``, in file order."""
        return tuple(n for n in self.nodes if n.gpus > 0 and n.gpu_type == gpu_type)


def cluster_from_doc(doc: Any) -> Cluster:
    """Validate a decoded cluster document; errors name the field (``spec.nodes[1].gpus``)."""
    root = fields.mapping(doc, "")
    kind = root.get("kind", "Cluster")
    if kind != "Cluster":
        raise fields.FieldError("kind", f"must be Cluster, got {kind!r}")
    meta = fields.mapping(root.get("metadata", {}), "metadata")
    name = fields.string(meta.get("name", "cluster"), "metadata.name")
    spec = fields.mapping(fields.require(root, "spec", ""), "spec")
    raw_nodes = fields.sequence(fields.require(spec, "nodes", "spec"), "spec.nodes")
    nodes = []
    for i, item in enumerate(raw_nodes):
        path = f"spec.nodes[{i}]"
        obj = fields.mapping(item, path)
        gpus = fields.integer(fields.require(obj, "gpus", path), f"{path}.gpus", minimum=0)
        gpu_type = fields.string(
            obj.get("gpuType", "cpu" if gpus == 0 else None) or "", f"{path}.gpuType"
        )
        memory = 0
        if gpus > 0:
            memory = fields.byte_quantity(
                fields.require(obj, "gpuMemory", path), f"{path}.gpuMemory"
            )
        nodes.append(
            Node(
                name=fields.string(obj.get("name", f"node-{i}"), f"{path}.name"),
                gpus=gpus,
                gpu_type=gpu_type,
                gpu_memory_bytes=memory,
            )
        )
    raw_ic = fields.mapping(spec.get("interconnect", {}), "spec.interconnect")

    def opt(key: str, positive: bool) -> float | None:
        if raw_ic.get(key) is None:
            return None
        path = f"spec.interconnect.{key}"
        return fields.number(raw_ic[key], path, positive=positive, minimum=None if positive else 0)

    efficiency = fields.number(
        raw_ic.get("efficiency", 0.7), "spec.interconnect.efficiency", positive=True
    )
    if efficiency > 1:
        raise fields.FieldError("spec.interconnect.efficiency", "must be in (0, 1]")
    interconnect = Interconnect(
        intra_gbps=opt("intraNodeGBps", True),
        intra_latency_us=opt("intraNodeLatencyUs", False),
        inter_gbps=opt("interNodeGBps", True),
        inter_latency_us=opt("interNodeLatencyUs", False),
        efficiency=efficiency,
    )
    return Cluster(name=name, nodes=tuple(nodes), interconnect=interconnect)
