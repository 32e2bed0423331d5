"""The device link model switch plans are timed with: per-device links by tier, and storage.

A device sends and receives over two tiers, each a separate per-device, per-direction resource:
intra-node (NVLink/NVSwitch) and inter-node (its NIC share); storage is one shared resource
with an aggregate read bandwidth; an optional per-device limit caps all a device sends (or
receives) over every tier (copy engines, a PCIe switch). A plan's time is its busiest
resource's bytes over its bandwidth (transfers overlap; latency is ignored: shards are hundreds
of MB). Finer than the transition planner's agent-level ``policies.links.LinkModel``, whose
figures :func:`from_agent_links` takes (local = intra-node, network = inter-node), so measured
links (``tessera bench copy``) serve both; :func:`from_comm` builds it from the planner's
``CommSpec``. Read by ``policies.switching.switch_plan`` and ``switch_bound``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from tessera import fields
from tessera.cost.profile import CommSpec

INTRA = "intra"
INTER = "inter"
STORAGE = "storage"
TIERS: tuple[str, ...] = (INTRA, INTER, STORAGE)

GpuRef = tuple[str, int]  # (node name, device index on that node)


@dataclass(frozen=True)
class DeviceLinks:
    """Bandwidths in bytes per second; per device and direction unless said otherwise."""

    intra_node_bytes_per_s: float  # NVLink / NVSwitch, per GPU, per direction
    inter_node_bytes_per_s: float  # the GPU's NIC share, per direction
    storage_bytes_per_s: float  # aggregate read bandwidth of the model storage
    device_bytes_per_s: float = math.inf  # cap on one device's total send (and receive)

    def __post_init__(self) -> None:
        for name in (
            "intra_node_bytes_per_s",
            "inter_node_bytes_per_s",
            "storage_bytes_per_s",
            "device_bytes_per_s",
        ):
            if not getattr(self, name) > 0:
                raise fields.FieldError(name, "must be > 0")

    def tier(self, source: GpuRef, target: GpuRef) -> str:
        """``intra`` when both devices share a node, else ``inter``."""
        return INTRA if source[0] == target[0] else INTER

    def bandwidth(self, tier: str) -> float:
        """Per-device bandwidth of ``tier`` (aggregate for storage)."""
        if tier == INTRA:
            return self.intra_node_bytes_per_s
        if tier == INTER:
            return self.inter_node_bytes_per_s
        if tier == STORAGE:
            return self.storage_bytes_per_s
        raise fields.FieldError("tier", f"must be one of {', '.join(TIERS)}, got {tier!r}")


def from_comm(comm: CommSpec, storage_bytes_per_s: float) -> DeviceLinks:
    """A link model from the planner's effective links plus a storage bandwidth."""
    return DeviceLinks(
        intra_node_bytes_per_s=comm.intra_node.bandwidth_bytes_per_s,
        inter_node_bytes_per_s=comm.inter_node.bandwidth_bytes_per_s,
        storage_bytes_per_s=storage_bytes_per_s,
    )


class AgentLinks(Protocol):
    """The figures of ``tessera.policies.links.LinkModel`` this module reads."""

    @property
    def storage_bytes_per_s(self) -> float: ...
    @property
    def network_bytes_per_s(self) -> float: ...
    @property
    def local_bytes_per_s(self) -> float: ...


def from_agent_links(agent_links: AgentLinks) -> DeviceLinks:
    """Per-device tiers from the transition planner's agent-level link figures."""
    return DeviceLinks(
        intra_node_bytes_per_s=agent_links.local_bytes_per_s,
        inter_node_bytes_per_s=agent_links.network_bytes_per_s,
        storage_bytes_per_s=agent_links.storage_bytes_per_s,
    )


Resource = tuple[str, str, GpuRef | None]  # (direction "out"/"in"/"storage", tier, device)


def resources(source: GpuRef | None, target: GpuRef, tier: str) -> tuple[Resource, ...]:
    """The resources one transfer loads: sender tier, receiver tier, device totals; or the
    storage and the receiver's inter-node tier (storage reads arrive over the network)."""
    if tier == STORAGE or source is None:
        return (("storage", STORAGE, None), ("in", INTER, target), ("in", "all", target))
    return (
        ("out", tier, source),
        ("in", tier, target),
        ("out", "all", source),
        ("in", "all", target),
    )


def capacity(model: DeviceLinks, resource: Resource) -> float:
    """Bandwidth of a resource named by :func:`resources`."""
    direction, tier, _ = resource
    if direction == "storage":
        return model.storage_bytes_per_s
    if tier == "all":
        return model.device_bytes_per_s
    return model.bandwidth(tier)
