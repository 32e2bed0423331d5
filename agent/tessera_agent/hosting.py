"""The blocks an agent hosts: load (from the checkpoint or a peer), rewire, unload, look up.

One `Hosting` per agent process, owned by the servicer, which only translates protos to
calls of it. Loads are serialised (one lock) and run on a loader thread; each is
validated (`load_check`) before anything is read or transferred, books its bytes on its
device (`booking`) and, for stage 0, gets its replica engine (`leader`). Blocks are
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
from pathlib import Path

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
    load_sources,
    sleep_shards,
    speculate_serve,
    stage_link,
    stitch_serve,
    switch_fetch,
    tp_member,
)
from tessera_agent.engine import (
    block_zoo,
    compile_policy,
    decode_graph,
    errors,
    layer_run,
    loader,
    omp_teams,
    replica,
    stage,
)
from tessera_agent.transfer import block_copy, group

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
        self._settling: set[asyncio.Task[None]] = set()  # gc settles waiting for warm-ups

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
        kept: dict[str, torch.Tensor] | None = None,
    ) -> Loaded:
        """Load the block; with the compiled decode on (an agent's default) answer only
        once its graphs exist (`compile_policy.warm_before_ready`): ready means warm.
        `kept`: its tensors as a sleep kept them in host memory (a TP rank's slices)."""
        began = time.monotonic()
        loaded = await self._load(
            spec, source, max_num_seqs, max_batched_tokens, data_plane, parts, kept
        )
        graph = loaded.hosted.stage.runner.decode_graph
        # "already loaded" too: a retried load (its first call timed out) waits as well
        if graph is not None and graph.state == "warming":
            if compile_policy.warm_before_ready(
                self.defaults.engine, graph.device
            ):  # outside the load lock
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
        kept: dict[str, torch.Tensor] | None = None,
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
            dev = self.memory.device(spec.device)
            loop = asyncio.get_running_loop()
            copy = source is not None or bool(parts)
            planned = await loop.run_in_executor(self.loader, stage.plan_bytes, spec, not copy)
            cfg = planned[0]
            load_check.check_against_model(spec, cfg)
            group_spec = convert.group_from_proto(data_plane, spec, dev.kind)
            tensors, moved_by = None, ""
            throttled = self.defaults.storage_bytes_per_s > 0
            read = load_sources.counting(
                functools.partial(
                    switch_fetch.read_checkpoint,
                    Path(spec.model_path),
                    bytes_per_s=self.defaults.storage_bytes_per_s,
                )
            )
            cached: dict[str, torch.Tensor] = {}
            known: dict[str, str] = {}
            if kept is not None:  # a woken TP rank's own slices, kept in host memory
                cached = dict(kept)
            elif source is None:  # the host cache first, whatever else the load names
                cached, known = await loop.run_in_executor(
                    self.loader,
                    load_sources.from_cache,
                    self.host_cache,
                    spec,
                    cfg,
                    dev.torch_device(),
                )
            copied = [(p.source, p.unit_start, p.unit_end) for p in parts]
            if source is not None:  # the whole block from one peer
                copied = [(source, 0, cfg.num_layers + 2)]
            if self.defaults.block_zoo and copied:  # the holders' digests: no hashing again
                known.update(
                    await load_sources.peer_digests(
                        copied,
                        cfg.num_layers,
                        lambda rid, i: self.get(rid, i).stage,
                        self.defaults.tls,
                    )
                )
            if parts:  # a switch plan's parts (issue 11)
                stage.kv_pages(spec, cfg, planned[1], dev.free_bytes)
                tensors, moved_by = await switch_fetch.gather(
                    parts,
                    cfg,
                    spec.start,
                    spec.end,
                    Path(spec.model_path),
                    lambda rid, i: self.get(rid, i).stage,
                    self.store_address,
                    dev.torch_device(),
                    group.choose([dev.kind]),
                    read,
                    cached,
                    tls=self.defaults.tls,
                )
                source = None
            elif source is None and (throttled or cached):  # cache, storage at its bandwidth
                names = loader.checkpoint_names(cfg, spec.start, spec.end)
                rest = [n for n in names if n not in cached]
                tensors = dict(cached)
                if rest:
                    tensors.update(await loop.run_in_executor(self.loader, read, rest))
                tensors = {n: tensors[n] for n in names}
                moved_by = f"{len(cached)} tensors from the host cache" if cached else ""
            if source is not None:  # refuse before transferring anything when it cannot fit
                stage.kv_pages(spec, cfg, planned[1], dev.free_bytes)
                names = loader.checkpoint_names(cfg, spec.start, spec.end)
                tensors, moved_by = await block_copy.fetch(
                    source,
                    names,
                    self.store_address,
                    dev.torch_device(),
                    group.choose([dev.kind]),
                    tls=self.defaults.tls,
                )
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
            h.sources = load_sources.tally(tensors, cached, read.bytes_read, planned[1])
            h.data_plane = data_plane
            self.memory.book(dev.id, h.holder, loaded.own_param_bytes + loaded.kv_bytes)
            if graph_bytes:
                self.memory.book(dev.id, f"{h.holder}/decode-graph", graph_bytes)
            if reserve is not None:  # the graph part is replaced by the measured pool below
                self.memory.book(dev.id, f"{h.holder}/reserve", reserve.total_bytes)
            compile_policy.begin(
                loaded.runner.decode_graph, graph_bytes, loaded.runner.cache.layers()
            )
            self._settle_when_warm(loaded.runner.decode_graph, h.holder)
            if loaded.runner.graphs is not None:  # CUDA graphs: captured before ready
                took = await loop.run_in_executor(self.compute, loaded.runner.capture_graphs)
                g = loaded.runner.graphs
                log.info(
                    "%s: %d CUDA graphs captured in %s s (%d past the budget; error: %s)",
                    h.holder,
                    len(g.buckets),
                    "-" if took is None else f"{took:.1f}",
                    g.skipped,
                    g.error,
                )
                if loaded.runner.graphs.pool_bytes:
                    graphs_holder = f"{h.holder}/cuda-graphs"
                    self.memory.book(dev.id, graphs_holder, loaded.runner.graphs.pool_bytes)
                if reserve is not None and g.capture_s is not None:
                    left = reserve.total_bytes - reserve.graph_bytes
                    self.memory.book(dev.id, f"{h.holder}/reserve", left)
            if loaded.pieces is not None:  # each new piece is booked once, for every user
                for piece in loaded.pieces.adopted.new:
                    self.memory.book(dev.id, piece.holder, self.zoo.nbytes(piece))
            if group_spec is not None:  # forms in the background; rank 0's steps wait for it
                h.tp = tp_member.TPMember(loaded, group_spec, dev.torch_device())
            if data_plane is not None and data_plane.store_address and spec.tp_rank == 0:
                t = data_plane.timeout_s or group.DEFAULT_TIMEOUT_S
                dp = (data_plane.store_address, data_plane.group)
                if not spec.is_last:  # stage links: rank 0 to rank 0, formed in the background
                    h.link_down = stage_link.StageLink(
                        stage_link.link_spec(*dp, spec.stage_index, 0, t)
                    )
                if spec.stage_index > 0:
                    h.link_up = stage_link.StageLink(
                        stage_link.link_spec(*dp, spec.stage_index - 1, 1, t)
                    )
                if spec.num_stages > 1 and (spec.is_last or spec.stage_index == 0):
                    # the sampled tokens' way back: last stage (rank 0) to leader (rank 1)
                    back = stage_link.StageLink(
                        stage_link.return_spec(*dp, 0 if spec.is_last else 1, t)
                    )
                    if spec.is_last:
                        h.result_out = back
                    else:
                        h.result_in = back
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
                f"copied from {source.address} over {moved_by}"
                if source is not None
                else moved_by or "from the checkpoint"
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

    async def offload(self, replica_id: str) -> list[blocks.Block]:
        """Unload every block (every rank) of `replica_id` held here, leaving their pieces
        in the host cache (a TP rank's slices in `shards`) and releasing their KV pools;
        returns the blocks, for `restore`. A TP stage with a rank on another agent is
        refused (its group would be left without this rank)."""
        ranks = self.ranks(replica_id)
        for h in ranks:
            spec = h.stage.spec
            here = sum(1 for o in ranks if o.stage.spec.stage_index == spec.stage_index)
            if spec.tp_size > here:
                raise errors.FailedPreconditionError(
                    f"replica {replica_id} stage {spec.stage_index}: {here} of its "
                    f"{spec.tp_size} TP ranks are on agent {self.agent_id}; a replica sleeps "
                    "only with every rank of its TP stages on one agent"
                )
        specs = sorted((h.stage.spec for h in ranks), key=lambda b: (-b.stage_index, b.tp_rank))
        loop = asyncio.get_running_loop()
        for h in ranks:
            if h.stage.spec.tp_size > 1:
                await loop.run_in_executor(
                    self.loader, self.shards.park, h.stage, h.data_plane, self._host_copy
                )
        for stage_index in sorted({b.stage_index for b in specs}, reverse=True):
            await self.unload(replica_id, stage_index)
        return specs

    async def restore(self, specs: Sequence[blocks.Block]) -> list[Loaded]:
        """Load blocks again (as `offload` returned them), from the host cache as far as
        it still holds them (a TP rank from its kept slices, in a group named afresh),
        storage for the rest; last stage first, ranks in order."""
        self.shards.wakes += 1
        planes: dict[int, pb.DataPlane | None] = {}  # one new group per stage
        out = []
        for b in sorted(specs, key=lambda b: (-b.stage_index, b.tp_rank)):
            parked = self.shards.take(b.key)
            if parked is None:
                out.append(await self.load(b))
                continue
            if b.stage_index not in planes:
                planes[b.stage_index] = self.shards.renamed(parked.data_plane)
            dp = planes[b.stage_index]
            out.append(await self.load(b, data_plane=dp, kept=parked.tensors))
        return out

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
                await self._unload_one(h)
        if self.defaults.gc_settle:  # once this frame has let go of them: reclaim the stage
            asyncio.get_running_loop().call_soon(
                functools.partial(gc_heap.settle, f"unloaded {replica_id}/{stage_index}", True)
            )

    def _settle_when_warm(self, graph: decode_graph.CompiledDecode | None, holder: str) -> None:
        """Freeze the heap (`gc_heap`) once the block's compiled decode, whose compiler
        state is most of the new objects, has warmed up; at once when there is none."""
        if not self.defaults.gc_settle:
            return

        async def settle() -> None:
            if graph is not None and graph.state == "warming":
                await asyncio.get_running_loop().run_in_executor(None, graph.wait)
            gc_heap.settle(f"loaded {holder}")

        task = asyncio.get_running_loop().create_task(settle())
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _unload_one(self, h: hosted.Hosted) -> None:
        replica_id = h.stage.spec.replica_id
        if h.leader is not None:
            await h.leader.close()
        if h.tp is not None:  # rank 0 stops its followers; a follower lets go
            await asyncio.get_running_loop().run_in_executor(None, h.tp.close)
        h.close_links()
        speculate_serve.close(h.stage.speculate)
        layer_run.close_runs(h.stage.runner.runs)  # replicas of its layer runs go too
        for d in self.memory.devices.values():  # and their bookings on this agent
            for k in [k for k in d.used if k.startswith(f"run:{replica_id}/")]:
                del d.used[k]
        self.memory.release(h.stage.spec.device, h.holder)
        self.memory.release(h.stage.spec.device, f"{h.holder}/decode-graph")
        self.memory.release(h.stage.spec.device, f"{h.holder}/cuda-graphs")
        self.memory.release(h.stage.spec.device, f"{h.holder}/reserve")
        freed: list[block_zoo.PieceKey] | None = None
        if h.stage.pieces is not None:  # pieces no other block uses are freed
            freed = h.stage.pieces.release()
            for piece in freed:
                self.memory.release(h.stage.spec.device, piece.holder)
        if self.host_cache.budget_bytes > 0:  # ... and kept in host memory while room lasts
            await asyncio.get_running_loop().run_in_executor(
                self.loader, load_sources.keep, self.host_cache, h.stage, freed, self._host_copy
            )
        log.info("unloaded %s rank %d", h.holder, h.stage.spec.tp_rank)
