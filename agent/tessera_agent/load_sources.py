"""Where a load's bytes come from — the host cache, peers, storage — and how many from each.

`from_cache` takes every piece of a block the agent's host block cache holds
(`host_cache`), before any peer or storage is asked; `counting` wraps the storage reader
so the bytes it read are known; `Sources` is what a loaded block reports (`Describe`'s
`BlockInfo.load`: peer, host and storage bytes and the seconds the load took, ready
included); `peer_digests` gets the content digests of pieces copied from other blocks
from their holders (no hashing again). `keep` is the unload side: the pieces of a block
being unloaded go into the cache (those no other block still holds). Called by
`hosting.Hosting` (on its loader thread, but for the async `peer_digests`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import grpc
import torch

from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc
from tessera_agent import host_cache, switch_fetch
from tessera_agent.engine import block_zoo, dtypes, errors, stage
from tessera_agent.engine import config as config_mod

Read = Callable[[list[str]], dict[str, torch.Tensor]]


def nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class Sources:
    """Bytes of one load by source, and its seconds from the request to ready."""

    peer: int = 0  # copied from another block (a peer agent, or one on this agent)
    host: int = 0  # taken from this agent's host block cache
    storage: int = 0  # read from the checkpoint
    seconds: float = 0.0

    def to_proto(self) -> pb.BlockLoadSource:
        return pb.BlockLoadSource(
            peer_bytes=self.peer,
            host_bytes=self.host,
            storage_bytes=self.storage,
            seconds=self.seconds,
        )


def tally(
    tensors: dict[str, torch.Tensor] | None,
    cached: dict[str, torch.Tensor],
    storage_bytes: int,
    param_bytes: int,
) -> Sources:
    """A load's bytes by source: what the cache gave, what storage read, peers the rest
    (no tensors handed over: the loader read all of it from storage)."""
    if tensors is None:
        return Sources(storage=param_bytes)
    host = nbytes(cached.values())
    total = nbytes(tensors.values())
    return Sources(peer=max(0, total - host - storage_bytes), host=host, storage=storage_bytes)


@dataclass
class Counting:
    """A storage reader that counts the bytes it read."""

    read: Read
    bytes_read: int = field(default=0)

    def __call__(self, names: list[str]) -> dict[str, torch.Tensor]:
        out = self.read(names)
        self.bytes_read += nbytes(out.values())
        return out


def counting(read: Read) -> Counting:
    return Counting(read)


def digests_of(st: stage.Stage) -> dict[str, str]:
    """`{piece: digest}` of a loaded block's pieces in the zoo ({} without the zoo)."""
    return {} if st.pieces is None else {k.piece: k.digest for k in st.pieces.adopted.keys}


def _piece(unit: int, num_layers: int) -> str:
    return "embed" if unit == 0 else "final" if unit == num_layers + 1 else f"layer.{unit - 1}"


async def peer_digests(
    parts: Sequence[tuple[pb.BlockSource, int, int]],
    num_layers: int,
    lookup: Callable[[str, int], stage.Stage],
    tls: transport.TlsFiles | None,
) -> dict[str, str]:
    """Digests of the pieces a load copies from other blocks, as their holders know them
    (`{piece: digest}`), so the copy is not hashed again: from the block itself on this
    agent (`local`), else from its agent's `ListBlocks`. `parts`: (source, unit range).
    A holder that does not answer or has no zoo gives none (the load hashes them)."""
    out: dict[str, str] = {}
    listed: dict[str, dict[tuple[str, int], dict[str, str]]] = {}
    for src, u0, u1 in parts:
        if not src.address or src.transport == switch_fetch.HOST:
            continue
        if src.transport == switch_fetch.LOCAL:
            try:
                have = digests_of(lookup(src.replica_id, src.stage_index))
            except errors.NotFoundError:
                continue
        else:
            if src.address not in listed:
                listed[src.address] = await _list_digests(src.address, tls)
            have = listed[src.address].get((src.replica_id, src.stage_index), {})
        for u in range(u0, u1):
            piece = _piece(u, num_layers)
            if piece in have:
                out[piece] = have[piece]
    return out


async def _list_digests(
    address: str, tls: transport.TlsFiles | None
) -> dict[tuple[str, int], dict[str, str]]:
    channel = transport.channel(address, tls)
    try:
        reply = await pb_grpc.AgentStub(channel).ListBlocks(pb.ListBlocksRequest(), timeout=10.0)
    except grpc.aio.AioRpcError:
        return {}
    finally:
        await channel.close()
    return {(b.replica_id, b.stage_index): dict(b.piece_digests) for b in reply.blocks}


def served_dtype(spec: stage.BlockSpec, cfg: config_mod.ModelConfig) -> str:
    return dtypes.name_of(stage.dtype_of(spec, cfg))


def from_cache(
    cache: host_cache.HostCache,
    spec: stage.BlockSpec,
    cfg: config_mod.ModelConfig,
    device: torch.device,
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The block's tensors the cache holds (checkpoint names, on `device`) and their
    pieces' digests; nothing for a tensor-parallel shard or an empty cache."""
    if cache.budget_bytes <= 0 or spec.tp_size > 1:
        return {}, {}
    pieces = [p for p, _ in block_zoo.piece_names(cfg, spec.start, spec.end)]
    return cache.take(spec.model_path, pieces, served_dtype(spec, cfg), device)


def keep(
    cache: host_cache.HostCache,
    st: stage.Stage,
    freed: Iterable[block_zoo.PieceKey] | None,
    host_copy: host_cache.HostCopy,
) -> int:
    """Put the pieces of an unloaded block into the cache: with the zoo, those it just
    freed (`freed`; the others stay held by another block); without, every piece (its
    digest computed here, off the load path). Returns the pieces kept."""
    spec = st.spec
    if cache.budget_bytes <= 0 or spec.tp_size > 1:
        return 0
    dtype = served_dtype(spec, st.cfg)
    digests = {k.piece: k.digest for k in freed} if freed is not None else None
    kept = 0
    for piece, names in block_zoo.piece_names(st.cfg, spec.start, spec.end):
        tensors = {n: st.tensor(n) for n in names}
        if digests is None:
            digest = block_zoo.digest(tensors, names)
        elif piece in digests:
            digest = digests[piece]
        else:
            continue
        kept += cache.put(spec.model_path, piece, dtype, digest, tensors, host_copy)
    return kept


def cache_to_proto(cache: host_cache.HostCache) -> pb.HostCache:
    """The cache as `Describe` reports it."""
    st = cache.stats()
    return pb.HostCache(
        budget_bytes=st.budget_bytes,
        used_bytes=st.used_bytes,
        pieces=[
            pb.HostCachedPiece(
                model_path=c.model_path,
                piece=c.piece,
                dtype=c.dtype,
                digest=c.digest,
                nbytes=c.nbytes,
            )
            for c in cache.contents()
        ],
        hits=st.hits,
        misses=st.misses,
        hit_bytes=st.hit_bytes,
        evicted=st.evicted,
    )
