"""Unloading one block (one rank) an agent holds: what it releases and what it keeps.

`release` stops the block's leader, TP group and stage links and its layer runs' replicas,
frees every booking it made on its device, releases the zoo pieces no other block shares,
and keeps its pieces in the host block cache while that has room (the cache a later load,
wake or scale-out reads first). Called by `hosting.Hosting.unload` under its load lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable

import torch

from tessera_agent import booking, host_cache, hosted, load_sources, speculate_serve
from tessera_agent.engine import block_zoo, layer_run

log = logging.getLogger("tessera_agent.hosting")


async def release(
    h: hosted.Hosted,
    memory: booking.Booking,
    cache: host_cache.HostCache,
    pool: concurrent.futures.Executor,
    host_copy: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    """Stop `h`'s leader, group and links, free its bookings (its layer runs' too) and the
    zoo pieces no other block uses, and keep its pieces in `cache` while room lasts (on
    the loader thread `pool`, copied to host memory by `host_copy`)."""
    replica_id = h.stage.spec.replica_id
    if h.leader is not None:
        await h.leader.close()
    if h.tp is not None:  # rank 0 stops its followers; a follower lets go
        await asyncio.get_running_loop().run_in_executor(None, h.tp.close)
    h.close_links()
    speculate_serve.close(h.stage.speculate)
    layer_run.close_runs(h.stage.runner.runs)  # replicas of its layer runs go too
    for d in memory.devices.values():  # and their bookings on this agent
        for k in [k for k in d.used if k.startswith(f"run:{replica_id}/")]:
            del d.used[k]
    memory.release(h.stage.spec.device, h.holder)
    memory.release(h.stage.spec.device, f"{h.holder}/decode-graph")
    memory.release(h.stage.spec.device, f"{h.holder}/cuda-graphs")
    memory.release(h.stage.spec.device, f"{h.holder}/reserve")
    freed: list[block_zoo.PieceKey] | None = None
    if h.stage.pieces is not None:  # pieces no other block uses are freed
        freed = h.stage.pieces.release()
        for piece in freed:
            memory.release(h.stage.spec.device, piece.holder)
    if cache.budget_bytes > 0:  # ... and kept in host memory while room lasts
        await asyncio.get_running_loop().run_in_executor(
            pool, load_sources.keep, cache, h.stage, freed, host_copy
        )
    log.info("unloaded %s rank %d", h.holder, h.stage.spec.tp_rank)
