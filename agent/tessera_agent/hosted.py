"""What an agent holds: a loaded block and, for stage 0, the replica engine it leads.

Created by `hosting.Hosting.load`; read by every RPC and by the metrics collector. The
block's identity (`stage.spec`, a `tessera.blocks.Block`) carries its stage count and
next-stage address; a rewire replaces the spec with the new address.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera_agent.engine import replica, stage


@dataclass
class Hosted:
    """A block this agent holds, and (for stage 0) the replica engine it leads."""

    stage: stage.Stage
    leader: replica.ReplicaEngine | None = None

    @property
    def num_stages(self) -> int:
        return self.stage.spec.num_stages

    @property
    def next_address(self) -> str:
        return self.stage.spec.next_address

    @property
    def holder(self) -> str:
        return f"{self.stage.spec.replica_id}/{self.stage.spec.stage_index}"
