"""The blocks an agent hosts: load (from the checkpoint or a peer), rewire, unload, look up.

One `Hosting` per agent process, owned by the servicer, which only translates protos to
calls of it. Loads are serialised (one lock) and run on a loader thread; each is
validated (`load_check`) before anything is read or transferred, books its bytes on its
device (`booking`) and, for stage 0, gets its replica engine (`leader`): the building
and the releasing are `block_build.BlockBuilder`'s, which owns the load resources
(loader thread, host cache, block zoo); this module keeps what is held. Blocks are
keyed by (replica id, stage): blocks of a new layout generation carry a new replica id,
so they load beside the old generation's and both serve until the old one is unloaded.
An agent may hold several tensor-parallel ranks of one stage, each on its own declared
device (a node agent serving tp=2 on cuda:0 and cuda:1): `hosted` answers for the stage
with the lowest rank held here (rank 0 when held: Generate, stage streams, KV and
metrics go to it) and `more_ranks` holds the others, keyed by (replica, stage, rank).
A load of a block already held with the same layout is answered as already loaded; one
that differs only in its next-stage address rewires the stage.
Every load takes what the agent's host block cache holds first (`host_cache`,
`load_sources`), then its peers' parts or source, then storage, and records the bytes
from each and its time to ready; every unload leaves its pieces in that cache.
`offload` and `restore` are the sleep/wake pair built on it (a replica's blocks to the
cache and back).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import time
from collections.abc import Sequence

from tessera import blocks, gc_heap
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import (
    block_build,
    booking,
    hosted,
    load_check,
    load_config,
)
from tessera_agent.engine import (
    compile_policy,
    errors,
    replica,
    stage,
)

log = logging.getLogger(__name__)

Key = tuple[str, int]
RankKey = tuple[str, int, int]  # (replica id, stage, tp rank)


@dataclasses.dataclass(frozen=True)
class Loaded:
    hosted: hosted.Hosted
    how: str  # "loaded", "already loaded" or "rewired"


class Hosting:
    def __init__(
        self,
        agent_id: str,
        memory: booking.Booking,
        defaults: load_config.LoadDefaults,
        compute: concurrent.futures.Executor,
        store_address: str = "",
    ) -> None:
        self.agent_id, self.memory, self.defaults = agent_id, memory, defaults
        self.compute, self.store_address = compute, store_address
        self.hosted: dict[Key, hosted.Hosted] = {}  # the lowest rank of a stage held here
        self.more_ranks: dict[RankKey, hosted.Hosted] = {}  # its other ranks held here
        self.builder = block_build.BlockBuilder(
            agent_id,
            memory,
            defaults,
            compute,
            store_address,
            lambda rid, i: self.get(rid, i).stage,
        )
        b = self.builder  # what loads use, under the names the servicer and metrics read
        self.zoo, self.host_cache = b.zoo, b.host_cache
        self.shares, self.loader = b.shares, b.loader
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        for h in [*self.hosted.values(), *self.more_ranks.values()]:
            if h.leader is not None:
                await h.leader.close()
            if h.tp is not None:
                h.tp.close()
            h.close_links()
        self.loader.shutdown(wait=False, cancel_futures=True)

    # -- look-ups -----------------------------------------------------------------------
    def get(self, replica_id: str, stage_index: int) -> hosted.Hosted:
        h = self.hosted.get((replica_id, stage_index))
        if h is None:
            raise errors.NotFoundError(
                f"replica {replica_id} has no stage {stage_index} on agent {self.agent_id}"
            )
        return h

    def leader(self, replica_id: str) -> replica.ReplicaEngine:
        h = self.hosted.get((replica_id, 0))
        if h is None or h.leader is None:
            raise errors.NotFoundError(
                f"replica {replica_id!r} is not led by agent {self.agent_id} (no stage 0 here)"
            )
        return h.leader

    def ranks_of(self, replica_id: str, stage_index: int) -> list[hosted.Hosted]:
        """Every rank of the stage held here, lowest first."""
        first = self.hosted.get((replica_id, stage_index))
        if first is None:
            return []
        key = (replica_id, stage_index)
        more = [h for k, h in self.more_ranks.items() if k[:2] == key]
        return [first, *sorted(more, key=lambda h: h.stage.spec.tp_rank)]

    def held(self) -> list[tuple[blocks.Block, stage.Stage]]:
        """Every hosted block (every rank) with the bytes it holds, in key order."""
        every = [(k[0], k[1], h.stage.spec.tp_rank, h) for k, h in self.hosted.items()]
        every += [(*k, h) for k, h in self.more_ranks.items()]
        return [(self.observed(h), h.stage) for *_, h in sorted(every, key=lambda e: e[:3])]

    @staticmethod
    def observed(h: hosted.Hosted) -> blocks.Block:
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

    # -- changes ------------------------------------------------------------------------
    async def load(
        self,
        spec: blocks.Block,
        source: pb.BlockSource | None = None,
        max_num_seqs: int = 0,
        max_batched_tokens: int = 0,
        data_plane: pb.DataPlane | None = None,
        parts: Sequence[pb.SwitchSource] = (),
    ) -> Loaded:
        """Load the block; with the compiled decode on (an agent's default) answer only
        once its graphs exist (`compile_policy.warm_before_ready`): ready means warm."""
        began = time.monotonic()
        loaded = await self._load(spec, source, max_num_seqs, max_batched_tokens, data_plane, parts)
        graph = loaded.hosted.stage.runner.decode_graph
        # "already loaded" too: a retried load (its first call timed out) waits as well
        if graph is not None and graph.state == "warming":
            if compile_policy.warm_before_ready(graph.device):  # outside the load lock
                await asyncio.get_running_loop().run_in_executor(None, graph.wait)
                log.info(
                    "%s: ready after its warm-up (compile: %s, %.1f s)",
                    loaded.hosted.holder,
                    graph.status,
                    graph.warmup_s,
                )
        if loaded.how == "loaded":
            loaded.hosted.sources.seconds = time.monotonic() - began
        return loaded

    async def _load(
        self,
        spec: blocks.Block,
        source: pb.BlockSource | None,
        max_num_seqs: int,
        max_batched_tokens: int,
        data_plane: pb.DataPlane | None,
        parts: Sequence[pb.SwitchSource],
    ) -> Loaded:
        load_check.check_request(spec)
        async with self._lock:
            began = time.monotonic()
            key = (spec.replica_id, spec.stage_index)
            same = {h.stage.spec.tp_rank: h for h in self.ranks_of(*key)}
            if spec.tp_rank in same or (same and spec.tp_size == 1):
                return self._again(same.get(spec.tp_rank) or self.hosted[key], spec)
            for h in same.values():  # ranks of one stage held here: one device per rank
                have = h.stage.spec
                if have.tp_size != spec.tp_size or have.device == spec.device:
                    why = (
                        f"is already on {have.device}; rank {spec.tp_rank} needs a device "
                        "of its own"
                        if have.tp_size == spec.tp_size
                        else f"is held here; rank {spec.tp_rank} of tp={spec.tp_size} does "
                        "not fit it (unload it first: a new layout takes a new replica id)"
                    )
                    raise errors.FailedPreconditionError(
                        f"replica {spec.replica_id} stage {spec.stage_index}: rank "
                        f"{have.tp_rank} of tp={have.tp_size} {why}"
                    )
            h = await self.builder.build(
                spec, source, max_num_seqs, max_batched_tokens, data_plane, parts, began
            )
            self._index(key, h)
            return Loaded(h, "loaded")

    # -- sleep and wake (issue 32: the agent side of them) ---------------------------------
    async def offload(self, replica_id: str) -> list[blocks.Block]:
        """Unload every block of `replica_id` held here, leaving their pieces in the host
        cache and releasing their KV pools; returns the blocks, for `restore`."""
        specs = sorted(
            {h.stage.spec for k, h in self.hosted.items() if k[0] == replica_id},
            key=lambda b: -b.stage_index,
        )
        for b in specs:
            await self.unload(b.replica_id, b.stage_index)
        return specs

    async def restore(self, specs: Sequence[blocks.Block]) -> list[Loaded]:
        """Load blocks again (as `offload` returned them), from the host cache as far as
        it still holds them, storage for the rest; last stage first."""
        return [await self.load(b) for b in sorted(specs, key=lambda b: -b.stage_index)]

    def _again(self, h: hosted.Hosted, spec: blocks.Block) -> Loaded:
        have = h.stage.spec
        if have == spec:
            return Loaded(h, "already loaded")
        if have == dataclasses.replace(spec, next_address=have.next_address):
            h.stage.spec = spec  # new streams and the leader's next connect use it
            log.info("rewired %s to %s", h.holder, spec.next_address or "(last stage)")
            return Loaded(h, "rewired")
        raise errors.FailedPreconditionError(
            f"replica {spec.replica_id} stage {spec.stage_index} is already loaded "
            f"with layers [{have.start}, {have.end}) on {have.device}; unload it first "
            "(a new layout takes a new replica id)"
        )

    def _index(self, key: Key, h: hosted.Hosted) -> None:
        """File a new rank: the stage's lowest rank held here answers for it."""
        have = self.hosted.get(key)
        if have is None or h.stage.spec.tp_rank < have.stage.spec.tp_rank:
            self.hosted[key] = h
            if have is not None:
                self.more_ranks[(*key, have.stage.spec.tp_rank)] = have
        else:
            self.more_ranks[(*key, h.stage.spec.tp_rank)] = h

    async def unload(self, replica_id: str, stage_index: int, tp_rank: int | None = None) -> None:
        """Unload rank `tp_rank` of the stage, or every rank held here when None (rank 0
        first: it tells the followers to stop, so theirs then close without waiting)."""
        async with self._lock:
            ranks = self.ranks_of(replica_id, stage_index)
            if tp_rank is not None:
                ranks = [h for h in ranks if h.stage.spec.tp_rank == tp_rank]
            if not ranks:
                which = "" if tp_rank is None else f" rank {tp_rank}"
                raise errors.NotFoundError(
                    f"replica {replica_id} has no stage {stage_index}{which} on agent "
                    f"{self.agent_id}"
                )
            key = (replica_id, stage_index)
            for h in ranks:
                rank = h.stage.spec.tp_rank
                if self.hosted.get(key) is h:
                    del self.hosted[key]
                    rest = sorted(k for k in self.more_ranks if k[:2] == key)
                    if rest:  # the next rank held here answers for the stage
                        self.hosted[key] = self.more_ranks.pop(rest[0])
                else:
                    del self.more_ranks[(*key, rank)]
                await self.builder.release(h)
        if gc_heap.installed():  # once this frame has let go of them: reclaim the stage
            asyncio.get_running_loop().call_soon(
                functools.partial(gc_heap.settle, f"unloaded {replica_id}/{stage_index}", True)
            )
