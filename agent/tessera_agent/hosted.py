"""What an agent holds: a loaded block and, for stage 0, the replica engine it leads.

Created by `hosting.Hosting.load`; read by every RPC and by the metrics collector. The
block's identity (`stage.spec`, a `tessera.blocks.Block`) carries its stage count and
next-stage address; a rewire replaces the spec with the new address.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from tessera import blocks
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import load_sources, stage_link, tp_member
from tessera_agent.engine import replica, stage


@dataclass
class Hosted:
    """A block this agent holds, and (for stage 0) the replica engine it leads."""

    stage: stage.Stage
    leader: replica.ReplicaEngine | None = None
    tp: tp_member.TPMember | None = None  # this block's rank of a tensor-parallel stage
    link_down: stage_link.StageLink | None = None  # hidden states to the next stage
    link_up: stage_link.StageLink | None = None  # hidden states from the previous stage
    result_in: stage_link.StageLink | None = None  # leader: sampled tokens from the last stage
    result_out: stage_link.StageLink | None = None  # last stage: sampled tokens to the leader
    # where its bytes came from and its time to ready (issue 32)
    sources: load_sources.Sources = field(default_factory=load_sources.Sources)
    data_plane: pb.DataPlane | None = None  # as loaded: a TP rank's group (a wake re-forms it)

    def close_links(self) -> None:
        for link in (self.link_down, self.link_up, self.result_in, self.result_out):
            if link is not None:
                link.close()

    @property
    def compile_status(self) -> str:
        """The stage's compiled or captured decode: "warm" (built at this load), "cached"
        (from the compile cache, `engine/compile_cache.py`), "compiling" (steps eager until
        it is over) or "eager" (off, failed, or none on this stage)."""
        r = self.stage.runner
        if r.graphs is not None:  # CUDA graphs, captured before the load answered
            return "warm" if r.graphs.ready else "eager"
        return r.decode_graph.status if r.decode_graph is not None else "eager"

    @property
    def num_stages(self) -> int:
        return self.stage.spec.num_stages

    @property
    def next_address(self) -> str:
        return self.stage.spec.next_address

    @property
    def holder(self) -> str:
        return f"{self.stage.spec.replica_id}/{self.stage.spec.stage_index}"


def observed(h: Hosted) -> blocks.Block:
    """The block as held: its bytes and, for a TP rank, its group's state."""
    state, reason = h.tp.status() if h.tp is not None else ("", "")
    return dataclasses.replace(
        h.stage.spec,
        param_bytes=h.stage.param_bytes,
        kv_bytes=h.stage.kv_bytes,
        transport=h.tp.backend if h.tp is not None else "",
        group_state=state,
        group_reason=reason,
        activations=""
        if h.stage.spec.is_last or h.stage.spec.tp_rank
        else ("gloo" if h.link_down is not None and h.link_down.ready else "grpc"),
        results=""
        if h.stage.spec.stage_index or h.stage.spec.tp_rank or h.stage.spec.is_last
        else ("gloo" if h.result_in is not None and h.result_in.ready else "grpc"),
        compile=h.compile_status,
    )
