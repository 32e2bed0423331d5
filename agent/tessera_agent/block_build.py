"""Builds each block an agent loads, and releases each one it unloads.

`BlockBuilder.build` is a load past `hosting.Hosting`'s checks (no block of that key is
held): the tensors from the host cache first, then a switch plan's parts, one peer's
whole block or storage (at its throttled bandwidth); the device's reserves (activations
and CUDA-graph pool, the compiled decode's packed weights); the stage built on the loader
thread; its bytes booked on its device; CUDA graphs captured; the tensor-parallel group,
the stage links over the data plane and, for stage 0, the leader. `release` is the unload
side. Owned by `hosting.Hosting`, which keeps the index of what is held and the load lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from collections.abc import Callable, Sequence
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
    stage_link,
    stitch_serve,
    switch_fetch,
    tp_member,
)
from tessera_agent.engine import (
    block_zoo,
    compile_policy,
    decode_graph,
    layer_run,
    loader,
    omp_teams,
    stage,
)
from tessera_agent.transfer import block_copy, group

log = logging.getLogger(__name__)


class BlockBuilder:
    """The agent's load resources (loader thread, host cache, block zoo, shared reports)
    and the two things done with them: build a block, release one."""

    def __init__(
        self,
        agent_id: str,
        memory: booking.Booking,
        defaults: load_config.LoadDefaults,
        compute: concurrent.futures.Executor,
        store_address: str,
        get_stage: Callable[[str, int], stage.Stage],
    ) -> None:
        self.store_address = store_address  # this agent's rendezvous store (block copies)
        self.agent_id, self.memory, self.defaults, self.compute = (
            agent_id,
            memory,
            defaults,
            compute,
        )
        self.get_stage = get_stage  # a held block's stage, by (replica id, stage index)
        self.zoo = block_zoo.BlockZoo()  # identical pieces of every block, held once
        # unloaded pieces kept in host memory, LRU within its budget (0: no cache)
        self.host_cache = host_cache.HostCache(defaults.host_cache_bytes, memory)
        kinds = {d.kind for d in memory.devices.values()}
        self._host_copy = devices.host_copy("cuda" if "cuda" in kinds else "cpu")
        self.shares = equivalence_share.ReportCache()  # opted-in fine-tunes' reports
        self.loader = omp_teams.ReleasingPool(1, thread_name_prefix="loader")
        self._settling: set[asyncio.Task[None]] = set()  # gc settles waiting for warm-ups

    async def build(
        self,
        spec: blocks.Block,
        source: pb.BlockSource | None,
        max_num_seqs: int,
        max_batched_tokens: int,
        data_plane: pb.DataPlane | None,
        parts: Sequence[pb.SwitchSource],
        began: float,
    ) -> hosted.Hosted:
        """The new block, ready to index; the caller holds the load lock."""
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
        if source is None:  # the host cache first, whatever else the load names
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
            known.update(await load_sources.peer_digests(copied, cfg.num_layers, self.get_stage))
        if parts:  # a switch plan's parts (issue 11)
            stage.kv_pages(spec, cfg, planned[1], dev.free_bytes)
            tensors, moved_by = await switch_fetch.gather(
                parts,
                cfg,
                spec.start,
                spec.end,
                Path(spec.model_path),
                self.get_stage,
                self.store_address,
                dev.torch_device(),
                group.choose([dev.kind]),
                read,
                cached,
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
        graph_bytes = compile_policy.load_reserve(  # compiled decode's packed weights
            cfg,
            spec.start,
            spec.end,
            stage.dtype_of(spec, cfg),
            spec.tp_size,
            dev.torch_device(),
            dev.free_bytes - planned[1] - reserve_bytes,
            spec.kv_bytes,
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
        built_s = time.monotonic() - fetched_at
        omp_teams.release()  # the loop thread's team, if it ever built one (see omp_teams)
        h = hosted.Hosted(loaded)
        h.sources = load_sources.tally(tensors, cached, read.bytes_read, planned[1])
        self.memory.book(dev.id, h.holder, loaded.own_param_bytes + loaded.kv_bytes)
        if graph_bytes:
            self.memory.book(dev.id, f"{h.holder}/decode-graph", graph_bytes)
        if reserve is not None:  # the graph part is replaced by the measured pool below
            self.memory.book(dev.id, f"{h.holder}/reserve", reserve.total_bytes)
        compile_policy.begin(loaded.runner.decode_graph, graph_bytes, loaded.runner.cache.layers())
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
            )
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
        return h

    def _settle_when_warm(self, graph: decode_graph.CompiledDecode | None, holder: str) -> None:
        """Freeze the heap (`gc_heap`) once the block's compiled decode, whose compiler
        state is most of the new objects, has warmed up; at once when there is none."""
        if not gc_heap.installed():
            return

        async def settle() -> None:
            if graph is not None and graph.state == "warming":
                await asyncio.get_running_loop().run_in_executor(None, graph.wait)
            gc_heap.settle(f"loaded {holder}")

        task = asyncio.get_running_loop().create_task(settle())
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def release(self, h: hosted.Hosted) -> None:
        """What unloading `h` frees: its leader, group and links, its bookings, the
        pieces no other block uses (kept in the host cache while room lasts)."""
        replica_id = h.stage.spec.replica_id
        if h.leader is not None:
            await h.leader.close()
        if h.tp is not None:  # rank 0 stops its followers; a follower lets go
            await asyncio.get_running_loop().run_in_executor(None, h.tp.close)
        h.close_links()
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
