"""The blocks an agent hosts: load (from the host cache, a peer or storage), rewire, unload.

One `Hosting` per agent process, owned by the servicer, which only translates protos to
calls of it. Loads are serialised (one lock) and run on a loader thread: validated first
(`load_check`), tensors fetched (`load_fetch`), built and booked on the device (`booking`),
wired (`load_wire`) and, for stage 0, given their replica engine (`leader`); a compiled
decode is warm before the load answers. Blocks are keyed by (replica id, stage), so a new
layout generation (a new replica id) loads beside the old one. Several TP ranks of one
stage may be held here, each on its own device: `hosted` answers for the stage with its
lowest rank held here, `more_ranks` holds the others. Unloads (`unload`) keep pieces in
the host block cache; sleep and wake (`sleep.offload` / `sleep.restore`) build on both.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import time
from collections.abc import Sequence

import torch

from tessera import blocks, gc_heap
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import (
    booking,
    convert,
    devices,
    equivalence_share,
    gpu_devices,
    host_cache,
    hosted,
    leader,
    load_check,
    load_config,
    load_fetch,
    load_ready,
    load_sources,
    load_wire,
    sleep_shards,
    speculate_serve,
    stitch_serve,
    tp_member,
    unload,
)
from tessera_agent.engine import (
    block_zoo,
    compile_policy,
    errors,
    omp_teams,
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
        self.store_address = store_address  # this agent's rendezvous store (block copies)
        self.agent_id, self.memory, self.defaults, self.compute = (
            agent_id,
            memory,
            defaults,
            compute,
        )
        self.hosted: dict[Key, hosted.Hosted] = {}  # the lowest rank of a stage held here
        self.more_ranks: dict[RankKey, hosted.Hosted] = {}  # its other ranks held here
        self.zoo = block_zoo.BlockZoo()  # identical pieces of every block, held once
        # unloaded pieces kept in host memory, LRU within its budget (0: no cache)
        self.host_cache = host_cache.HostCache(defaults.host_cache_bytes, memory)
        self.shards = sleep_shards.Shards(memory)  # sleeping TP ranks' slices
        kinds = {d.kind for d in memory.devices.values()}
        self._host_copy = devices.host_copy("cuda" if "cuda" in kinds else "cpu")
        self.shares = equivalence_share.ReportCache()  # opted-in fine-tunes' reports
        self.loader = omp_teams.ReleasingPool(
            1, thread_name_prefix="loader", release=defaults.engine.omp_release
        )
        self._lock = asyncio.Lock()
        # gc settles waiting for warm-ups, by holder (a load awaits its own: `load`)
        self._settling: dict[str, asyncio.Task[None]] = {}

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
        return [(hosted.observed(h), h.stage) for *_, h in sorted(every, key=lambda e: e[:3])]

    # -- changes ------------------------------------------------------------------------
    async def load(
        self,
        spec: blocks.Block,
        source: pb.BlockSource | None = None,
        max_num_seqs: int = 0,
        max_batched_tokens: int = 0,
        data_plane: pb.DataPlane | None = None,
        parts: Sequence[pb.SwitchSource] = (),
        kept: dict[str, torch.Tensor] | None = None,
    ) -> Loaded:
        """Load the block; with the compiled decode on (an agent's default) answer only
        once its graphs exist (`compile_policy.warm_before_ready`) and the collector has
        settled what they made (`gc_heap`): ready means warm.
        `kept`: its tensors as a sleep kept them in host memory (a TP rank's slices)."""
        began = time.monotonic()
        loaded = await self._load(
            spec, source, max_num_seqs, max_batched_tokens, data_plane, parts, kept
        )
        await load_ready.until_ready(
            loaded.hosted,
            loaded.how == "loaded",
            self.defaults,
            self.compute,
            self._settling,
            max_num_seqs,
            max_batched_tokens,
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
        kept: dict[str, torch.Tensor] | None = None,
    ) -> Loaded:
        load_check.check_request(spec)
        async with self._lock:
            began = time.monotonic()
            key = (spec.replica_id, spec.stage_index)
            same = {h.stage.spec.tp_rank: h for h in self.ranks_of(*key)}
            if spec.tp_rank in same or (same and spec.tp_size == 1):
                return self._again(same.get(spec.tp_rank) or self.hosted[key], spec)
            load_check.check_ranks([h.stage.spec for h in same.values()], spec)
            dev = self.memory.device(spec.device)
            loop = asyncio.get_running_loop()
            copy = source is not None or bool(parts)
            planned = await loop.run_in_executor(self.loader, stage.plan_bytes, spec, not copy)
            cfg = planned[0]
            load_check.check_against_model(spec, cfg)
            group_spec = convert.group_from_proto(data_plane, spec, dev.kind)
            got = await load_fetch.fetch(
                spec,
                cfg,
                planned[1],
                dev,
                source,
                parts,
                kept,
                defaults=self.defaults,
                pool=self.loader,
                cache=self.host_cache,
                stage_of=lambda rid, i: self.get(rid, i).stage,
                store_address=self.store_address,
            )
            tensors, cached, known, source = got.tensors, got.cached, got.known, got.source
            report = None
            if spec.share_from:  # issue 14: equivalent layers from the foundation's weights
                report, tensors = await loop.run_in_executor(
                    self.loader, equivalence_share.prepare, self.shares, spec, cfg, tensors
                )
            fetched_at = time.monotonic()
            reserve = gpu_devices.load_reserve(  # CUDA: activations and graph pool
                cfg,
                spec.start,
                spec.end,
                stage.dtype_of(spec, cfg),
                spec.tp_size,
                max_batched_tokens or self.defaults.max_batched_tokens,
                max_num_seqs or self.defaults.max_num_seqs,
                dev.torch_device(),
            )
            reserve_bytes = 0 if reserve is None else reserve.total_bytes
            stitch = None
            if spec.stitch_zoo:  # issue 35: a stitched chain's front; refused before loading
                stitch = await loop.run_in_executor(
                    self.loader,
                    stitch_serve.prepare,
                    spec,
                    cfg,
                    dev.torch_device(),
                    stage.dtype_of(spec, cfg),
                )
            if spec.speculate_zoo:  # issue 35: a speculated bottleneck; refused before loading
                await loop.run_in_executor(self.loader, speculate_serve.check, spec)
            graph_bytes = compile_policy.load_reserve(  # compiled decode's packed weights
                cfg,
                spec.start,
                spec.end,
                stage.dtype_of(spec, cfg),
                spec.tp_size,
                dev.torch_device(),
                dev.free_bytes - planned[1] - reserve_bytes,
                spec.kv_bytes,
                self.defaults.engine,
            )
            loaded = await loop.run_in_executor(
                self.loader,
                stage.load_stage,
                spec,
                dev.torch_device(),
                dev.free_bytes - graph_bytes - reserve_bytes,
                planned,
                tensors,
                self.zoo if self.defaults.block_zoo else None,
                known,
                self.defaults.engine,
            )
            loaded.equivalence = report
            loaded.stitch = stitch
            if spec.speculate_zoo:  # issue 35: a speculated bottleneck's surrogate
                loaded.speculate = await loop.run_in_executor(
                    self.loader,
                    speculate_serve.prepare,
                    spec,
                    dev.torch_device(),
                    loaded.kv_bytes,
                    stage.load_stage,
                )
            loaded.slow_s = speculate_serve.slow_s(spec, self.defaults.slow_block)
            built_s = time.monotonic() - fetched_at
            if self.defaults.engine.omp_release:  # the loop thread's team, if it built one
                omp_teams.release()
            h = hosted.Hosted(loaded)
            h.sources = load_sources.tally(tensors, cached, got.reader.bytes_read, planned[1])
            h.data_plane = data_plane
            self.memory.book(dev.id, h.holder, loaded.own_param_bytes + loaded.kv_bytes)
            if graph_bytes:
                self.memory.book(dev.id, f"{h.holder}/decode-graph", graph_bytes)
            if reserve is not None:  # the graph part is replaced by the measured pool below
                self.memory.book(dev.id, f"{h.holder}/reserve", reserve.total_bytes)
            compile_policy.begin(
                loaded.runner.decode_graph, graph_bytes, loaded.runner.cache.layers()
            )
            load_ready.settle_when_warm(
                loaded.runner.decode_graph, h.holder, self.defaults, self._settling
            )
            if loaded.runner.graphs is not None:  # CUDA graphs: captured before ready
                await load_wire.capture_graphs(h, self.memory, dev.id, reserve, self.compute)
            if loaded.pieces is not None:  # each new piece is booked once, for every user
                for piece in loaded.pieces.adopted.new:
                    self.memory.book(dev.id, piece.holder, self.zoo.nbytes(piece))
            if group_spec is not None:  # forms in the background; rank 0's steps wait for it
                h.tp = tp_member.TPMember(loaded, group_spec, dev.torch_device())
            load_wire.link_stages(h, spec, data_plane)
            if spec.stage_index == 0 and spec.tp_rank == 0:
                cfg_s = leader.scheduler_config(h, self.defaults, max_num_seqs, max_batched_tokens)
                h.leader = leader.make_leader(
                    h,
                    cfg_s,
                    self.compute,
                    self.defaults.pipeline_microbatches,
                    self.defaults.microbatch_split,
                    tls=self.defaults.tls,
                )
            self._index(key, h)
            how = (
                f"copied from {source.address} over {got.moved_by}"
                if source is not None
                else got.moved_by or "from the checkpoint"
            ) + f" in {fetched_at - began:.2f} s"
            log.info(
                "loaded %s layers [%d, %d) on %s (generation %d), %s (built in %.2f s)",
                h.holder,
                spec.start,
                spec.end,
                dev.id,
                spec.generation,
                how,
                built_s,
            )
            return Loaded(h, "loaded")

    # -- sleep and wake (issue 32: the agent side of them) ---------------------------------
    def ranks(self, replica_id: str) -> list[hosted.Hosted]:
        """Every rank of every stage of `replica_id` held here."""
        every = [*self.hosted.values(), *self.more_ranks.values()]
        return [h for h in every if h.stage.spec.replica_id == replica_id]

    def _again(self, h: hosted.Hosted, spec: blocks.Block) -> Loaded:
        how = load_check.again(h.stage.spec, spec)
        if how == "rewired":
            h.stage.spec = spec  # new streams and the leader's next connect use it
            log.info("rewired %s to %s", h.holder, spec.next_address or "(last stage)")
        return Loaded(h, how)

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
                await unload.release(h, self.memory, self.host_cache, self.loader, self._host_copy)
        if self.defaults.gc_settle:  # once this frame has let go of them: reclaim the stage
            asyncio.get_running_loop().call_soon(
                functools.partial(gc_heap.settle, f"unloaded {replica_id}/{stage_index}", True)
            )
