"""Link model: how long moving a block's bytes takes, from storage or from a peer agent.

The transition planner (`policies.transition`) copies a block from a peer that holds its
tensors when `copy_seconds` beats `read_seconds`. Defaults are conservative figures for
a node with a local NVMe checkpoint and a 10 Gb/s pod network; callers that measured
their links (`tessera bench copy`) pass their own. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LinkModel:
    storage_bytes_per_s: float = 1.0e9  # checkpoint read into device memory
    network_bytes_per_s: float = 1.25e9  # agent to agent (gRPC FetchTensors)
    local_bytes_per_s: float = 8.0e9  # between two blocks of one agent
    latency_s: float = 0.05  # fixed cost of any transfer (connection, first chunk)
    # measured agent-to-agent bandwidths, (source agent, target agent) -> bytes/s
    pairs: Mapping[tuple[str, str], float] = field(default_factory=dict)
    # measured storage bandwidth per agent (a node with a slow network volume)
    storage: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rates = [self.storage_bytes_per_s, self.network_bytes_per_s, self.local_bytes_per_s]
        rates += [*self.pairs.values(), *self.storage.values()]
        if any(r <= 0 for r in rates) or self.latency_s < 0:
            raise ValueError("link model: bandwidths must be > 0 and latency >= 0")

    def read_seconds(self, agent: str, nbytes: int) -> float:
        """Reading `nbytes` of checkpoint on `agent`."""
        return self.latency_s + nbytes / self.storage.get(agent, self.storage_bytes_per_s)

    def copy_seconds(self, source: str, target: str, nbytes: int) -> float:
        """Copying `nbytes` of a hosted block from agent `source` to agent `target`."""
        rate = self.pairs.get((source, target))
        if rate is None:
            rate = self.local_bytes_per_s if source == target else self.network_bytes_per_s
        return self.latency_s + nbytes / rate
