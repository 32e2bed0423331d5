"""Where a full fine-tune's chain blocks go (BlockLLM §5.3): beside the foundation's stage
they mirror when memory allows, else by the locality-aware policy.

Block i of a chain is planned on the agent of the foundation's stage i, where the layers it
shares are zoo pieces already held, so it adds only its own layers and KV pool. A block
whose home has no room is placed by `locality.place` over the other agents, next to its
heaviest chain neighbour when memory allows. A loaded block stays (level-triggered); blocks
that fit nowhere stay home and are listed; tensor-parallel chain blocks keep the mirror.
Pure; called by the converge pass (`control/variant_place.py`) in `tessera up` and the
operator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tessera import blocks
from tessera.policies import placement
from tessera.policies.transition import model as transition_model
from tessera.policies.variants import locality as placement_locality
from tessera.policies.variants import stitch_chains


@dataclass(frozen=True)
class Moved:
    """A chain block placed away from its home (the foundation stage's agent)."""

    replica_id: str
    stage_index: int
    home: str
    agent: str


@dataclass(frozen=True)
class ChainPlacement:
    target: transition_model.Target
    moved: tuple[Moved, ...]
    unplaced: tuple[tuple[str, int], ...]  # (chain id, stage) that fit nowhere: left at home


def place_full_chains(
    target: transition_model.Target,
    chain_ids: frozenset[str],
    rooms: Sequence[stitch_chains.AgentRoom],
    model: placement.ModelBytes | None,
    held: Mapping[str, Mapping[int, str]] | None = None,
    hop_bytes: float = 1.0,
    locality: bool = True,
) -> ChainPlacement:
    """`target` with the chains `chain_ids` (already mirrored) placed (module docstring).
    `rooms` say each agent's memory free of every other block; `held[chain][stage]` is
    where a loaded chain block is (its bytes already out of that agent's room)."""
    by_name = {r.name: r for r in rooms}
    free = {r.name: r.free_bytes for r in rooms}
    ours = [
        p
        for p in target.blocks
        if p.block.replica_id in chain_ids and p.block.tp_size == 1 and p.agent in by_name
    ]
    ours.sort(key=lambda p: (p.block.replica_id, p.block.stage_index))
    here: dict[str, float] = {}  # a block's bytes at its home: its own layers and KV pool
    away: dict[str, float] = {}  # elsewhere: the whole block
    for p in ours:
        b, bid = p.block, _bid(p.block)
        here[bid] = b.param_bytes + b.kv_bytes
        whole = (
            stitch_chains.block_bytes(b.model_path, model, b.start, b.end, frozenset())
            if model is not None
            else float(b.param_bytes)
        )
        away[bid] = max(whole, b.param_bytes) + b.kv_bytes
    pinned: dict[str, str] = {}
    for p in ours:  # loaded blocks stay; the rest stay home while it has room
        bid = _bid(p.block)
        at = (held or {}).get(p.block.replica_id, {}).get(p.block.stage_index)
        if at is not None and at in free:  # its bytes are out of the room already
            pinned[bid] = at
    for p in ours:
        bid = _bid(p.block)
        if bid not in pinned and free[p.agent] >= here[bid]:
            pinned[bid] = p.agent
            free[p.agent] -= here[bid]
    homeless = [p for p in ours if _bid(p.block) not in pinned]
    sizes = {_bid(p.block): away[_bid(p.block)] for p in ours}
    cost = {_bid(p.block): {p.agent: here[_bid(p.block)]} for p in ours}
    chains = []
    for rid in sorted({p.block.replica_id for p in ours}):
        ids = tuple(_bid(p.block) for p in ours if p.block.replica_id == rid)
        chains.append(placement_locality.ChainUse(ids, 1.0, hop_bytes))
    decided = (
        placement_locality.place(sizes, free, chains, locality, cost=cost, held=pinned)
        if homeless
        else placement_locality.BlockPlacement("locality", dict(pinned), (), 0.0, 0.0, 0.0)
    )
    agent_of = {_bid(p.block): p.agent for p in target.blocks if p.block.replica_id in chain_ids}
    moved, unplaced = [], []
    for p in ours:
        bid = _bid(p.block)
        to = decided.server_of.get(bid)
        if to is None or to == p.agent:
            if to is None:
                unplaced.append((p.block.replica_id, p.block.stage_index))
            continue
        agent_of[bid] = to
        moved.append(Moved(p.block.replica_id, p.block.stage_index, p.agent, to))
    if not moved:
        return ChainPlacement(target, (), tuple(unplaced))
    out = []
    for p in target.blocks:
        b = p.block
        if b.replica_id not in chain_ids or b.tp_size != 1:
            out.append(p)
            continue
        room = by_name.get(agent_of.get(_bid(b), p.agent))
        nxt = by_name.get(agent_of.get(f"{b.replica_id}/{b.stage_index + 1}", ""))
        if room is None:
            out.append(p)
            continue
        blk = dataclasses.replace(
            b,
            device=room.device if room.name != p.agent else b.device,
            next_address=nxt.address if nxt is not None and not b.is_last else b.next_address,
        )
        out.append(dataclasses.replace(p, agent=room.name, address=room.address, block=blk))
    routes = tuple(
        dataclasses.replace(r, address=by_name[agent_of[f"{r.id}/0"]].address)
        if r.id in chain_ids and agent_of.get(f"{r.id}/0") in by_name
        else r
        for r in target.replicas
    )
    target = dataclasses.replace(target, blocks=tuple(out), replicas=routes)
    return ChainPlacement(target, tuple(moved), tuple(unplaced))


def _bid(b: blocks.Block) -> str:
    return f"{b.replica_id}/{b.stage_index}"
