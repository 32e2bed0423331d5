"""Where a load's tensors come from: the host cache, a peer's block, a switch plan's parts,
or the checkpoint at its declared storage speed.

`fetch` is the first half of `Hosting._load`: given the block, its planned config and the
device, it returns the tensors to build from (None: the loader reads the checkpoint
itself), how they moved, what the host cache gave and the zoo digests already known, so
nothing copied is hashed again. Refusals that need no transfer (a KV pool that cannot fit)
come before any byte moves. Called by `hosting.Hosting` under its load lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from tessera import blocks
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import devices, host_cache, load_config, load_sources, switch_fetch
from tessera_agent.engine import config, loader, stage
from tessera_agent.transfer import block_copy, group


@dataclasses.dataclass
class Fetched:
    tensors: dict[str, torch.Tensor] | None  # None: the loader reads the checkpoint
    moved_by: str  # how they came ("" from the checkpoint)
    cached: dict[str, torch.Tensor]  # what the host cache (or a sleep) kept
    known: dict[str, str]  # zoo digests already known, {piece: digest}
    reader: load_sources.Counting  # the storage reader (its bytes read)
    source: pb.BlockSource | None  # the whole-block peer, None after a parts copy


async def fetch(
    spec: blocks.Block,
    cfg: config.ModelConfig,
    param_bytes: int,
    dev: devices.Device,
    source: pb.BlockSource | None,
    parts: Sequence[pb.SwitchSource],
    kept: dict[str, torch.Tensor] | None,
    *,
    defaults: load_config.LoadDefaults,
    pool: concurrent.futures.Executor,
    cache: host_cache.HostCache,
    stage_of: Callable[[str, int], stage.Stage],
    store_address: str,
) -> Fetched:
    """The tensors of `spec`'s layers (see the module docstring); `param_bytes` as
    `stage.plan_bytes` gave them, `pool` the loader thread, `stage_of` finds a block held
    here (a peer part may be local)."""
    loop = asyncio.get_running_loop()
    tensors, moved_by = None, ""
    throttled = defaults.storage_bytes_per_s > 0
    read = load_sources.counting(
        functools.partial(
            switch_fetch.read_checkpoint,
            Path(spec.model_path),
            bytes_per_s=defaults.storage_bytes_per_s,
        )
    )
    cached: dict[str, torch.Tensor] = {}
    known: dict[str, str] = {}
    if kept is not None:  # a woken TP rank's own slices, kept in host memory
        cached = dict(kept)
    elif source is None:  # the host cache first, whatever else the load names
        cached, known = await loop.run_in_executor(
            pool, load_sources.from_cache, cache, spec, cfg, dev.torch_device()
        )
    copied = [(p.source, p.unit_start, p.unit_end) for p in parts]
    if source is not None:  # the whole block from one peer
        copied = [(source, 0, cfg.num_layers + 2)]
    if defaults.block_zoo and copied:  # the holders' digests: no hashing again
        known.update(
            await load_sources.peer_digests(copied, cfg.num_layers, stage_of, defaults.tls)
        )
    if parts:  # a switch plan's parts (issue 11)
        stage.kv_pages(spec, cfg, param_bytes, dev.free_bytes)
        tensors, moved_by = await switch_fetch.gather(
            parts,
            cfg,
            spec.start,
            spec.end,
            Path(spec.model_path),
            stage_of,
            store_address,
            dev.torch_device(),
            group.choose([dev.kind]),
            read,
            cached,
            tls=defaults.tls,
        )
        source = None
    elif source is None and (throttled or cached):  # cache, storage at its bandwidth
        names = loader.checkpoint_names(cfg, spec.start, spec.end)
        rest = [n for n in names if n not in cached]
        tensors = dict(cached)
        if rest:
            tensors.update(await loop.run_in_executor(pool, read, rest))
        tensors = {n: tensors[n] for n in names}
        moved_by = f"{len(cached)} tensors from the host cache" if cached else ""
    if source is not None:  # refuse before transferring anything when it cannot fit
        stage.kv_pages(spec, cfg, param_bytes, dev.free_bytes)
        names = loader.checkpoint_names(cfg, spec.start, spec.end)
        tensors, moved_by = await block_copy.fetch(
            source,
            names,
            store_address,
            dev.torch_device(),
            group.choose([dev.kind]),
            tls=defaults.tls,
        )
    return Fetched(tensors, moved_by, cached, known, read, source)
