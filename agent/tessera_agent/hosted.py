"""What an agent holds: a loaded block and, for stage 0, the replica engine it leads.

Created by the servicer's `LoadBlock`; read by every RPC and by the metrics collector.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera_agent import tp_member
from tessera_agent.engine import replica, stage


@dataclass
class Hosted:
    """A block this agent holds, and (for stage 0) the replica engine it leads."""

    stage: stage.Stage
    num_stages: int
    next_address: str
    leader: replica.ReplicaEngine | None = None
    tp: tp_member.TPMember | None = None  # this block's rank of a tensor-parallel stage

    @property
    def holder(self) -> str:
        return f"{self.stage.spec.replica_id}/{self.stage.spec.stage_index}"
