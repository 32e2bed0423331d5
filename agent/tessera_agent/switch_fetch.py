"""A block's parameters gathered in parts (issue 11): peers, this agent, storage.

`LoadBlock` with `switch_sources` (a layout switch's plan, `policies.transition.copy_sources`)
names, per unit range (0 the embedding, 1..L the decoder layers, L+1 the final norm and
lm_head), the hosted block to copy it from. `gather` fetches every part at once: a part on
this agent (`transport == "local"`) is taken from the hosted block in memory; a remote one
goes over the data plane when the plan says both ends have it (gRPC when the group cannot
form) or over gRPC; whatever no part names is read from the checkpoint meanwhile (storage
and peers in parallel: the plan splits a block between them by their rates). `read_checkpoint`
is the one storage reader of a load: when the agent declares a storage bandwidth
(`--storage-bandwidth`, e.g. a cluster's network volume, which a local page cache would
otherwise beat by far) it takes at least bytes / bandwidth. Called by `hosting.Hosting.load`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent.engine import config as config_mod
from tessera_agent.engine import errors, loader, stage
from tessera_agent.transfer import block_copy

LOCAL = "local"
HOST = "host"  # this agent's host block cache (`host_cache`)

Lookup = Callable[[str, int], stage.Stage]  # (replica id, stage) -> a block hosted here


def unit_names(cfg: config_mod.ModelConfig, u0: int, u1: int) -> list[str]:
    """Checkpoint names of units `[u0, u1)`."""
    n = cfg.num_layers
    if not 0 <= u0 < u1 <= n + 2:
        raise errors.InvalidArgumentError(
            f"switch_sources: units [{u0}, {u1}) are invalid for {n} layers (0..{n + 1})"
        )
    out: list[str] = []
    for u in range(u0, u1):
        if u == 0:
            out.append("model.embed_tokens.weight")
        elif u == n + 1:
            out.append("model.norm.weight")
            out.append("model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight")
        else:
            prefix = f"model.layers.{u - 1}."
            out += [x for x in loader.checkpoint_names(cfg, u - 1, u) if x.startswith(prefix)]
    return out


def read_checkpoint(
    model_path: Path, names: list[str], bytes_per_s: float
) -> dict[str, torch.Tensor]:
    """Read `names` from the checkpoint, at most at `bytes_per_s` (0: as fast as it goes).
    Runs on the loader thread."""
    started = time.monotonic()
    out = loader.read_tensors(model_path, names)
    if bytes_per_s > 0:
        nbytes = sum(t.numel() * t.element_size() for t in out.values())
        time.sleep(max(0.0, nbytes / bytes_per_s - (time.monotonic() - started)))
    return out


async def gather(
    parts: Sequence[pb.SwitchSource],
    cfg: config_mod.ModelConfig,
    start: int,
    end: int,
    model_path: Path,
    lookup: Lookup,
    store_address: str,
    device: torch.device,
    backend: str,
    read: Callable[[list[str]], dict[str, torch.Tensor]],
    have: Mapping[str, torch.Tensor] | None = None,
    *,
    tls: transport.TlsFiles | None,
) -> tuple[dict[str, torch.Tensor], str]:
    """(tensors by checkpoint name for layers [start, end), how they were moved). `read`
    reads names from storage (on the loader thread: the caller's `read_checkpoint`);
    `have`: tensors already at hand (the host cache's), fetched from nowhere. A part
    with transport `host` names this agent's host cache: what it no longer holds is read
    from storage."""
    needed = loader.checkpoint_names(cfg, start, end)
    out: dict[str, torch.Tensor] = {x: t for x, t in (have or {}).items() if x in set(needed)}
    want = set(needed) - set(out)
    remote: list[tuple[pb.BlockSource, list[str]]] = []
    how: list[str] = [f"{len(out)} tensors from the host cache"] if out else []
    for part in parts:
        if not part.source.address or part.source.transport == HOST:
            continue  # storage (or the host cache): read below with what no part covers
        names = [x for x in unit_names(cfg, part.unit_start, part.unit_end) if x in want]
        if not names:
            continue
        if part.source.transport == LOCAL:
            held = lookup(part.source.replica_id, part.source.stage_index)
            out.update({x: held.tensor(x).to(device) for x in names})
            how.append(f"units {part.unit_start}-{part.unit_end} local")
        else:
            remote.append((part.source, names))
    # storage reads what no part covers, at the same time as the peers send theirs
    coming = {x for _, names in remote for x in names}
    rest = [x for x in needed if x not in out and x not in coming]
    loop = asyncio.get_running_loop()
    stored = loop.run_in_executor(None, read, rest) if rest else None
    fetched = await asyncio.gather(
        *(
            block_copy.fetch(src, names, store_address, device, backend, tls=tls)
            for src, names in remote
        )
    )
    for (src, _), (tensors, moved_by) in zip(remote, fetched, strict=True):
        out.update(tensors)
        how.append(f"{len(tensors)} tensors from {src.address} over {moved_by}")
    if stored is not None:
        out.update(await stored)
        how.append(f"{len(rest)} tensors from storage")
    return {x: out[x] for x in needed}, "; ".join(how)
