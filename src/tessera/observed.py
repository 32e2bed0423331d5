"""What the agents report: devices, loaded blocks and replica load, as plain data.

Held blocks are `tessera.blocks.Block`s (the one block identity), with the bytes they hold.

Built by the operator's agent layer (`tessera_operator.agents.observe`) from `Describe`
replies, and by tests directly. Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera import blocks as blk


@dataclass(frozen=True)
class DeviceInfo:
    id: str
    kind: str
    capacity_bytes: int
    free_bytes: int
    name: str = ""  # e.g. "NVIDIA H100 80GB HBM3" (NVML), "virtual CPU device"


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
    blocks: tuple[blk.Block, ...] = ()
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
