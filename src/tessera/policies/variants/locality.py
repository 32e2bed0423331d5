"""Locality-aware block placement (BlockLLM §5.3): put blocks that follow each other in
many chains on the same server, when memory allows.

Inputs: the blocks (id -> parameter bytes), the servers (name -> memory bytes) and the
chains observed (block ids in order, requests seen, bytes one request sends per hop).
`traffic` counts, for every pair of blocks adjacent in some chain, how often they were
directly inter-dependent and how many bytes crossed between them (the paper's locality
counter). `place` decides where each block goes: with `locality=True` the pairs with the
most bytes are put together first; with `locality=False` it is the fragmentation-minimising
best fit the paper compares against. A block may cost less on some servers (`cost`: it
shares pieces a server already holds, the block zoo), and blocks already placed stay where
they are (`held`). Pure; called by `tessera.sim.blockllm_placement` and
`policies.stitch_chains` (the converge pass, so `tessera up`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tessera import fields


@dataclass(frozen=True)
class ChainUse:
    """One chain of blocks as observed: its blocks in order and its traffic."""

    blocks: tuple[str, ...]  # block ids, pipeline order
    requests: float  # requests that went through this chain
    hop_bytes: float  # bytes one request sends across each hop (hidden states of its tokens)

    def __post_init__(self) -> None:
        if not self.blocks:
            raise fields.FieldError("blocks", "a chain needs at least one block")
        if self.requests < 0 or self.hop_bytes < 0:
            raise fields.FieldError("requests", "requests and hop_bytes must be >= 0")


@dataclass(frozen=True)
class PairTraffic:
    """The locality counter of two blocks adjacent in chains (unordered pair)."""

    a: str
    b: str
    count: float  # requests that went directly from one to the other
    nbytes: float  # bytes those requests sent between them


@dataclass(frozen=True)
class BlockPlacement:
    """Where each block goes, and the traffic that placement leaves on the network."""

    policy: str  # "locality" or "frag_min"
    server_of: Mapping[str, str]  # block id -> server name (placed blocks only)
    unplaced: tuple[str, ...]  # blocks no server had room for
    cross_server_bytes: float  # bytes of the observed chains that cross servers
    local_bytes: float  # bytes that stay inside one server
    cross_server_hops: float  # request-hops that cross servers


def traffic(chains: Sequence[ChainUse]) -> tuple[PairTraffic, ...]:
    """Co-occurrence and bytes per adjacent pair, most bytes first (ties by name)."""
    count: dict[tuple[str, str], float] = {}
    nbytes: dict[tuple[str, str], float] = {}
    for chain in chains:
        for x, y in zip(chain.blocks, chain.blocks[1:], strict=False):
            if x == y:
                continue
            key = (x, y) if x < y else (y, x)
            count[key] = count.get(key, 0.0) + chain.requests
            nbytes[key] = nbytes.get(key, 0.0) + chain.requests * chain.hop_bytes
    pairs = [PairTraffic(a, b, count[(a, b)], nbytes[(a, b)]) for a, b in count]
    return tuple(sorted(pairs, key=lambda p: (-p.nbytes, -p.count, p.a, p.b)))


def place(
    blocks: Mapping[str, float],
    servers: Mapping[str, float],
    chains: Sequence[ChainUse],
    locality: bool = True,
    cost: Mapping[str, Mapping[str, float]] | None = None,
    held: Mapping[str, str] | None = None,
) -> BlockPlacement:
    """Place every block on one server within its memory (module docstring). `cost[b][s]`
    overrides block b's bytes on server s; `held[b]` is where b already is (its bytes are
    out of that server's memory given, and it does not move)."""
    for name, size in blocks.items():
        if size < 0:
            raise fields.FieldError(f"blocks.{name}", "bytes must be >= 0")
    free = dict(servers)
    where: dict[str, str] = {b: s for b, s in (held or {}).items() if b in blocks and s in free}
    costs = cost or {}

    def bytes_on(block: str, server: str) -> float:
        return costs.get(block, {}).get(server, blocks[block])

    def put(block: str, server: str) -> None:
        where[block] = server
        free[server] -= bytes_on(block, server)

    def fits(server: str, need: float) -> bool:
        return free[server] >= need

    if locality:
        pairs = traffic(chains)
        for pair in pairs:
            if pair.a not in blocks or pair.b not in blocks:
                continue
            a_at, b_at = where.get(pair.a), where.get(pair.b)
            if a_at is None and b_at is None:
                need = {s: bytes_on(pair.a, s) + bytes_on(pair.b, s) for s in free}
                roomy = [s for s in sorted(free) if fits(s, need[s])]
                if roomy:  # the least bytes (pieces held there), then the most free memory
                    least = min(need[s] for s in roomy)
                    best = max((s for s in roomy if need[s] == least), key=lambda s: (free[s], s))
                    put(pair.a, best)
                    put(pair.b, best)
            elif a_at is None and b_at is not None and fits(b_at, bytes_on(pair.a, b_at)):
                put(pair.a, b_at)
            elif b_at is None and a_at is not None and fits(a_at, bytes_on(pair.b, a_at)):
                put(pair.b, a_at)
        affinity: dict[str, dict[str, float]] = {}
        for pair in pairs:
            affinity.setdefault(pair.a, {})[pair.b] = pair.nbytes
            affinity.setdefault(pair.b, {})[pair.a] = pair.nbytes
        for block in sorted(blocks, key=lambda b: (-blocks[b], b)):
            if block in where:
                continue
            roomy = [s for s in sorted(free) if fits(s, bytes_on(block, s))]
            if not roomy:
                continue
            near = affinity.get(block, {})

            def pull(
                s: str, near: dict[str, float] = near, block: str = block
            ) -> tuple[float, float, float, str]:
                pulled = sum(v for k, v in near.items() if where.get(k) == s)
                return (pulled, -bytes_on(block, s), free[s], s)

            put(block, max(roomy, key=pull))
    else:
        for block in sorted(blocks, key=lambda b: (-blocks[b], b)):
            if block in where:
                continue
            roomy = [s for s in sorted(free) if fits(s, bytes_on(block, s))]
            if roomy:
                put(block, min(roomy, key=lambda s: (free[s] - bytes_on(block, s), s)))
    cross = local = hops = 0.0
    for chain in chains:
        for x, y in zip(chain.blocks, chain.blocks[1:], strict=False):
            sent = chain.requests * chain.hop_bytes
            if x != y and where.get(x) is not None and where.get(x) == where.get(y):
                local += sent
            elif x != y:
                cross += sent
                hops += chain.requests
    return BlockPlacement(
        policy="locality" if locality else "frag_min",
        server_of=dict(where),
        unplaced=tuple(sorted(b for b in blocks if b not in where)),
        cross_server_bytes=cross,
        local_bytes=local,
        cross_server_hops=hops,
    )
