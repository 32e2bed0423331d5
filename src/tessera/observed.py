"""What the agents report: devices and loaded blocks, as plain data for the reconcile core.

Built by the operator's agent layer (`tessera_operator.agents.observe`) from `Describe`
replies, and by tests directly. Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceInfo:
    id: str
    kind: str
    capacity_bytes: int
    free_bytes: int
    name: str = ""  # e.g. "NVIDIA H100 80GB HBM3" (NVML), "virtual CPU device"


@dataclass(frozen=True)
class BlockInfo:
    replica_id: str
    stage_index: int
    num_stages: int
    model_path: str
    start: int
    end: int
    device: str
    dtype: str = "float32"
    next_address: str = ""
    param_bytes: int = 0
    kv_bytes: int = 0


@dataclass(frozen=True)
class ReplicaLoad:
    """Leader-side KV use of one replica."""

    replica_id: str
    pages_total: int
    pages_used: int
    running: int = 0
    waiting: int = 0
    prefix_hit_tokens: int = 0
    cached_pages: int = 0


@dataclass(frozen=True)
class AgentInfo:
    name: str
    address: str
    reachable: bool = True
    devices: tuple[DeviceInfo, ...] = ()
    blocks: tuple[BlockInfo, ...] = ()
    kv: tuple[ReplicaLoad, ...] = ()
    error: str = ""  # why it is unreachable


@dataclass(frozen=True)
class Observed:
    agents: tuple[AgentInfo, ...] = ()

    def agent(self, name: str) -> AgentInfo | None:
        for a in self.agents:
            if a.name == name:
                return a
        return None
