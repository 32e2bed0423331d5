"""Link model: how long moving a block's bytes takes, from storage or from a peer agent.

The transition planner (`policies.transition`) copies a block from a peer that holds its
tensors when `copy_seconds` beats `read_seconds`. Defaults are conservative figures for
a node with a local NVMe checkpoint and a 10 Gb/s pod network; callers that measured
their links pass their own: `measured` builds the model from the agents' probes
(`ProbeLinks`, issue 32; or `tessera bench copy`). Pure.
"""

from __future__ import annotations

import dataclasses
import statistics
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


def measured(
    base: LinkModel,
    pairs: Mapping[tuple[str, str], float],
    storage: Mapping[str, float],
) -> LinkModel:
    """`base` with measured rates: per pair and per agent's storage, and their medians as
    the network and storage figures (what the switch plan's tiers read); rates of 0 (a
    probe that failed) are left out, and `base`'s figures stay where nothing was measured."""
    pairs = {k: v for k, v in pairs.items() if v > 0}
    storage = {k: v for k, v in storage.items() if v > 0}
    remote = [v for (a, b), v in pairs.items() if a != b]
    return dataclasses.replace(
        base,
        pairs=pairs,
        storage=storage,
        network_bytes_per_s=statistics.median(remote) if remote else base.network_bytes_per_s,
        storage_bytes_per_s=(
            statistics.median(storage.values()) if storage else base.storage_bytes_per_s
        ),
    )
