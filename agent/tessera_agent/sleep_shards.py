"""Tensor-parallel shards kept in host memory while their replica sleeps (issue 32).

The host block cache (`host_cache`) keys whole pieces by content, so it cannot hold one
rank's slice of a layer. A sleeping TP rank's parameters are kept here instead, by
(replica, stage, rank), as the rank held them (already sliced), with the data plane its
group formed on, and booked as host memory; waking loads the rank from them
(`loader.load_stage` takes sliced tensors as they are) into a group of a new name on the
same store, so no key of the old group is met again. Called by `sleep.offload`
and `restore`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import booking
from tessera_agent.engine import stage

RankKey = tuple[str, int, int]  # (replica id, stage, tp rank)


@dataclass(frozen=True)
class Parked:
    tensors: dict[str, torch.Tensor]  # checkpoint name -> this rank's slice, in host memory
    data_plane: pb.DataPlane | None  # the group's store and name at its load
    nbytes: int


def holder(key: RankKey) -> str:
    """The host memory booking's holder name of a parked rank."""
    return f"asleep:{key[0]}/{key[1]}/{key[2]}"


class Shards:
    """The parked ranks of one agent."""

    def __init__(self, memory: booking.Booking) -> None:
        self.memory = memory
        self.parked: dict[RankKey, Parked] = {}
        self.wakes = 0  # names each woken group afresh

    def park(
        self,
        st: stage.Stage,
        data_plane: pb.DataPlane | None,
        host_copy: Callable[[torch.Tensor], torch.Tensor],
    ) -> int:
        """Keep the rank's tensors (before its unload); returns their bytes."""
        tensors = {n: host_copy(st.tensor(n)) for n in st.tensor_names()}
        n = sum(t.numel() * t.element_size() for t in tensors.values())
        key = st.spec.key
        self.parked[key] = Parked(tensors, data_plane, n)
        self.memory.book_host(holder(key), n)
        return n

    def take(self, key: RankKey) -> Parked | None:
        """The parked rank (and its booking released), None when none is."""
        got = self.parked.pop(key, None)
        if got is not None:
            self.memory.release_host(holder(key))
        return got

    def drop(self, replica_id: str, stage_index: int) -> None:
        """Forget every parked rank of the stage (an unload of a sleeping block)."""
        for key in [k for k in self.parked if k[:2] == (replica_id, stage_index)]:
            self.take(key)

    def renamed(self, data_plane: pb.DataPlane | None) -> pb.DataPlane | None:
        """The data plane a woken group forms on: the same store, a new group name (the
        same for every rank of one wake: call once per wake)."""
        if data_plane is None:
            return None
        out = pb.DataPlane()
        out.CopyFrom(data_plane)
        out.group = f"{data_plane.group}.w{self.wakes}"
        return out
