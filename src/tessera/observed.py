"""What the agents report: devices, loaded blocks and replica load, as plain data.

Held blocks are `tessera.blocks.Block`s (the one block identity), with the bytes they hold.

Built by the operator's agent layer (`tessera.control.agents.observe`) from `Describe`
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
class LayerRunHolder:
    """One holder of a replicated layer run (module scaling, issue 15)."""

    name: str  # "<agent>/<device>"
    requests: int = 0  # running requests it serves at the run
    tokens_per_s: float = 0.0  # measured speed
    home: bool = False  # where an evicted replica's requests go back


@dataclass(frozen=True)
class LayerRun:
    """Layers [start, end) of a replica stage served by several holders."""

    replica_id: str
    stage_index: int
    start: int
    end: int
    migrated: bool  # the stage's own copy moved away (its home is elsewhere)
    holders: tuple[LayerRunHolder, ...] = ()


@dataclass(frozen=True)
class CachedPiece:
    """A piece in an agent's host block cache (issue 32)."""

    model_path: str
    piece: str  # "embed", "layer.<i>" or "final"
    dtype: str
    nbytes: int = 0


@dataclass(frozen=True)
class BlockLoad:
    """Where a held block's bytes came from and its seconds to ready (issue 32)."""

    replica_id: str
    stage_index: int
    tp_rank: int = 0
    peer_bytes: int = 0
    host_bytes: int = 0
    storage_bytes: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class AgentInfo:
    name: str
    address: str
    reachable: bool = True
    devices: tuple[DeviceInfo, ...] = ()
    blocks: tuple[blk.Block, ...] = ()
    kv: tuple[ReplicaLoad, ...] = ()
    error: str = ""  # why it is unreachable
    store_address: str = ""  # its rendezvous store, where data-plane groups meet
    layer_runs: tuple[LayerRun, ...] = ()  # replicated/migrated runs of stages it hosts
    host_cache: tuple[CachedPiece, ...] = ()  # its host block cache's pieces
    loads: tuple[BlockLoad, ...] = ()  # per held block: bytes by source, seconds to ready


@dataclass(frozen=True)
class Observed:
    agents: tuple[AgentInfo, ...] = ()

    def agent(self, name: str) -> AgentInfo | None:
        for a in self.agents:
            if a.name == name:
                return a
        return None
