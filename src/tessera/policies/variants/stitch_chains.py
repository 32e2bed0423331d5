"""Stitched chains of a deployment (BlockLLM §4.4): their blocks and their agents.

A `stitch` variant (`tessera.variant_spec`) serves the model through a smaller model's front:
per foundation replica, a chain of two blocks, the front (the small model's embedding and layers
[0, i), carrying the stitch to layer j: `Block.stitch_zoo`, `stitch_to`, `stitch_at`, applied by
`tessera_agent.stitch_serve`) and the tail (the model's layers [j, L), final norm and head).
Placement is BlockLLM's locality-aware `placement_locality.place`: pieces already on an agent
are not paid again, so both blocks land on the agent holding most of their pieces when there
is room, else they spread. A chain already held stays (level-triggered). `locality=False` is
the best-fit baseline. Pure; called by the converge pass (operator and `tessera up`);
`lines()` is what `tessera up` prints and the variant's status shows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tessera import blocks, routes_doc, variant_spec
from tessera.policies import placement
from tessera.policies.transition import model as transition_model
from tessera.policies.variants import locality as placement_locality
from tessera.policies.variants import plan as variant_plan

DEFAULT_CHAIN_KV_BYTES = variant_plan.DEFAULT_CHAIN_KV_BYTES
Unit = tuple[str, int]  # (checkpoint path, unit): 0 embedding, 1..L layers, L+1 norm + head


@dataclass(frozen=True)
class AgentRoom:
    """An agent as the placement sees it."""

    name: str
    address: str
    device: str  # where a new block goes
    free_bytes: float  # memory left once every planned block that is not a stitched chain's is in
    holds: frozenset[Unit] = frozenset()  # pieces it holds or will hold (the zoo shares them)


@dataclass(frozen=True)
class ChainPlace:
    """Where one stitched chain's blocks go."""

    variant: str
    replica_id: str
    front_agent: str
    tail_agent: str
    front: str  # e.g. "small[0, 2)"
    tail: str  # e.g. "large[3, 6)"

    def line(self) -> str:
        where = (
            f"both on {self.front_agent}"
            if self.front_agent == self.tail_agent
            else f"spread: front on {self.front_agent}, tail on {self.tail_agent}"
        )
        return f"{self.replica_id}: front {self.front} -> stitch -> tail {self.tail}, {where}"


@dataclass(frozen=True)
class StitchPlacement:
    """The target with the stitched chains in, and where they went."""

    target: transition_model.Target
    chains: tuple[ChainPlace, ...]
    unplaced: tuple[tuple[str, str], ...]  # (variant, chain id) left out: no agent had room
    policy: str  # "locality" or "frag_min"

    def lines(self, variant: str) -> list[str]:
        out = [c.line() for c in self.chains if c.variant == variant]
        out += [
            f"{rid}: no agent has room for its blocks" for v, rid in self.unplaced if v == variant
        ]
        return out


def units(model: placement.ModelBytes, start: int, end: int) -> list[int]:
    """The units a block of layers `[start, end)` holds."""
    out = list(range(start + 1, end + 1))
    if start == 0:
        out.insert(0, 0)
    if end == model.num_layers:
        out.append(model.num_layers + 1)
    return out


def block_bytes(
    path: str, model: placement.ModelBytes, start: int, end: int, holds: frozenset[Unit]
) -> float:
    """Parameter bytes of the block's units that `holds` does not already have."""
    return sum(model.unit_bytes(u) for u in units(model, start, end) if (path, u) not in holds)


def with_stitch_chains(
    target: transition_model.Target,
    variants: Sequence[variant_spec.VariantSpec],
    model_path: str,
    model: placement.ModelBytes,
    small: Mapping[str, placement.ModelBytes],
    rooms: Sequence[AgentRoom],
    held: Mapping[str, Mapping[int, str]] | None = None,
    kv_bytes: int = DEFAULT_CHAIN_KV_BYTES,
    hop_bytes: float = 1.0,
    locality: bool = True,
) -> StitchPlacement:
    """`target` plus one stitched chain per (foundation replica, stitch variant), placed
    (module docstring). `small[path]` are a small model's bytes; `held[chain id]` maps
    stage -> agent for chains already loaded; `hop_bytes` weighs each chain's hop."""
    stitched = [v for v in variants if v.kind == "stitch"]
    if not stitched or not rooms:
        return StitchPlacement(target, (), (), "locality" if locality else "frag_min")
    by_name = {r.name: r for r in rooms}
    sizes: dict[str, float] = {}
    cost: dict[str, dict[str, float]] = {}
    pinned: dict[str, str] = {}
    chains: list[placement_locality.ChainUse] = []
    wanted: list[tuple[variant_spec.VariantSpec, str, blocks.Block, blocks.Block]] = []
    for rep in target.replicas:
        mine = sorted(
            (
                p.block
                for p in target.blocks
                if p.block.replica_id == rep.id and p.block.tp_rank == 0
            ),
            key=lambda b: b.stage_index,
        )
        if not mine:
            continue
        base = mine[0]
        for v in stitched:
            i, j = v.point
            sm = small.get(v.path)
            if sm is None or i >= sm.num_layers or j >= model.num_layers:
                continue
            rid = variant_plan.variant_replica_id(rep.id, v.name)
            front = blocks.Block(
                v.path,
                0,
                i,
                replica_id=rid,
                stage_index=0,
                dtype=base.dtype,
                kv_bytes=kv_bytes,
                page_size=base.page_size,
                num_stages=2,
                generation=base.generation,
                stitch_zoo=v.zoo,
                stitch_to=model_path,
                stitch_at=j,
            )
            tail = dataclasses.replace(
                front,
                model_path=model_path,
                start=j,
                end=model.num_layers,
                stage_index=1,
                stitch_zoo="",
                stitch_to="",
                stitch_at=0,
            )
            ids = (f"{rid}/0", f"{rid}/1")
            for bid, b, m in ((ids[0], front, sm), (ids[1], tail, model)):
                sizes[bid] = block_bytes(b.model_path, m, b.start, b.end, frozenset()) + kv_bytes
                cost[bid] = {
                    r.name: block_bytes(b.model_path, m, b.start, b.end, r.holds) + kv_bytes
                    for r in rooms
                }
            for stage, bid in enumerate(ids):
                at = (held or {}).get(rid, {}).get(stage)
                if at is not None and at in by_name:
                    pinned[bid] = at
            chains.append(placement_locality.ChainUse(ids, 1.0, hop_bytes))
            wanted.append((v, rid, front, tail))
    free = {r.name: r.free_bytes for r in rooms}
    decided = placement_locality.place(sizes, free, chains, locality, cost=cost, held=pinned)
    placed: list[transition_model.Placed] = []
    routes: list[routes_doc.RouteReplica] = []
    out: list[ChainPlace] = []
    left: list[tuple[str, str]] = []
    for v, rid, front, tail in wanted:
        fa, ta = decided.server_of.get(f"{rid}/0"), decided.server_of.get(f"{rid}/1")
        if fa is None or ta is None:
            left.append((v.name, rid))
            continue
        f_room, t_room = by_name[fa], by_name[ta]
        front = dataclasses.replace(front, device=f_room.device, next_address=t_room.address)
        tail = dataclasses.replace(tail, device=t_room.device)
        placed += [
            transition_model.Placed(fa, f_room.address, front),
            transition_model.Placed(ta, t_room.address, tail),
        ]
        routes.append(routes_doc.RouteReplica(rid, f_room.address))
        out.append(chain_place(v.name, placed[-2], placed[-1]))
    target = dataclasses.replace(
        target, blocks=target.blocks + tuple(placed), replicas=target.replicas + tuple(routes)
    )
    return StitchPlacement(target, tuple(out), tuple(left), decided.policy)


def chain_place(
    variant: str, front: transition_model.Placed, tail: transition_model.Placed
) -> ChainPlace:
    """What a placed chain's two blocks say (`ChainPlace.line`)."""
    f, t = front.block, tail.block
    return ChainPlace(
        variant,
        f.replica_id,
        front.agent,
        tail.agent,
        f"{_short(f.model_path)}[{f.start}, {f.end})",
        f"{_short(t.model_path)}[{t.start}, {t.end})",
    )


def _short(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1] or path
