"""Copy sources of a transition's loads, chosen by the OServe switch plan.

A new block's layers may be held in parts by several old blocks (a stage boundary moved).
`assign` runs the greedy switch plan (`policies.switch_plan`, OServe Algorithm 2: intra-node
sources first, then the least-loaded pair link; storage only for what no block holds) over the
held blocks and the blocks to load, and returns per block its parts: unit ranges
(`policies.placement`: 0 embedding, 1..L layers, L+1 final norm and lm_head) each with a peer
block or storage, and for peers the transport (`local` on the same agent, the data plane when
both agents have a rendezvous store, else gRPC). A node is an agent and every block a device of
its own (`(agent, slot)`): a new block is always new memory. Only tp-1 blocks take part. Pure;
called by `policies.transition_steps` when `World.sourcing == "switch"` and by
`tessera bench switch`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tessera import blocks, fields
from tessera.policies import device_links
from tessera.policies.placement import GpuRef, ModelBytes, ReplicaPlacement, StagePlacement
from tessera.policies.switching import switch_bound, switch_plan
from tessera.policies.transition import actions, device_map, shards

LOCAL = "local"  # the source block is on the target's agent
DATA_PLANE = ""  # a data-plane group (gloo/nccl), gRPC as the fallback
GRPC = "grpc"

Where = tuple[str, tuple[str, int, int]]  # (agent, block key)


@dataclass(frozen=True)
class Held:
    """A block an agent holds now, with what a copy from it needs."""

    agent: str
    address: str
    block: blocks.Block
    store_address: str = ""  # its agent's rendezvous store ("" = no data plane)


@dataclass(frozen=True)
class Wanted:
    """A block to load, with its agent's data plane."""

    agent: str
    address: str
    block: blocks.Block
    store_address: str = ""


@dataclass(frozen=True)
class Assignment:
    """Parts per block to load, and the switch plan they came from."""

    parts: Mapping[Where, tuple[actions.SwitchPart, ...]]
    plan: switch_plan.SwitchPlan | None  # None when no block took part
    source: tuple[ReplicaPlacement, ...]  # the placements the plan saw (for its bound)
    model: ModelBytes

    def bound(self, link_model: device_links.DeviceLinks) -> switch_bound.SwitchBound | None:
        """The LP lower bound of this plan's time (None when no block took part)."""
        if self.plan is None:
            return None
        return switch_bound.bound(self.source, self.plan, self.model, link_model)


def units_of(b: blocks.Block, num_layers: int) -> tuple[int, int]:
    """The unit range `[u0, u1)` a block holds (embedding with layer 0, head with the last)."""
    return StagePlacement((b.start, b.end), (("", 0),)).units(num_layers)


def transport(source_agent: str, source_store: str, target_agent: str, target_store: str) -> str:
    """The fastest transport between two agents: in memory on one agent, the data plane
    when both ends have a rendezvous store, gRPC otherwise."""
    if source_agent == target_agent:
        return LOCAL
    return DATA_PLANE if source_store and target_store else GRPC


def _compatible(have: blocks.Block, want: blocks.Block) -> bool:
    return (
        have.model_path == want.model_path
        and have.dtype == want.dtype
        and have.tp_size == 1
        and want.tp_size == 1
    )


def _slots(held: Sequence[Held], wanted: Sequence[Wanted]) -> dict[Where, GpuRef]:
    """A device of its own per block; a wanted block already held keeps the held one's."""
    keys: dict[str, set[tuple[str, int, int]]] = {}
    for agent, b in [*((h.agent, h.block) for h in held), *((w.agent, w.block) for w in wanted)]:
        keys.setdefault(agent, set()).add(b.key)
    return {
        (agent, key): (agent, i) for agent, ks in keys.items() for i, key in enumerate(sorted(ks))
    }


def assign(
    held: Sequence[Held],
    wanted: Sequence[Wanted],
    model: ModelBytes,
    link_model: device_links.DeviceLinks,
) -> Assignment:
    """Parts for every unsharded block of `wanted` (module docstring). `held` are the
    blocks that stay held until these loads are done (make-before-break)."""
    # a stitched chain (issue 35) joins two models' layers: not one model to cover
    stitched = {
        b.replica_id for b in [*(h.block for h in held), *(w.block for w in wanted)] if b.stitch_zoo
    }
    loads = [w for w in wanted if w.block.tp_size == 1 and w.block.replica_id not in stitched]
    empty = Assignment({}, None, (), model)
    if not loads:
        return empty
    like = loads[0].block
    reloaded = {(w.agent, w.block.key) for w in loads}  # same name, reloaded: not a source
    sources = [
        h
        for h in held
        if _compatible(h.block, like)
        and (h.agent, h.block.key) not in reloaded
        and h.block.replica_id not in stitched
    ]
    slot = _slots(sources, loads)
    by_slot = {slot[(h.agent, h.block.key)]: h for h in sources}
    src = tuple(
        ReplicaPlacement(
            f"{h.agent}/{h.block.replica_id}/{h.block.stage_index}",
            (StagePlacement((h.block.start, h.block.end), (slot[(h.agent, h.block.key)],)),),
        )
        for h in sources
    )
    replicas: dict[str, list[Wanted]] = {}
    for w in loads:
        replicas.setdefault(w.block.replica_id, []).append(w)
    tgt = tuple(
        ReplicaPlacement(
            rid,
            tuple(
                StagePlacement((w.block.start, w.block.end), (slot[(w.agent, w.block.key)],))
                for w in sorted(ws, key=lambda w: w.block.stage_index)
            ),
        )
        for rid, ws in sorted(replicas.items())
    )
    # a replica of which only some stages load still must cover the model: add the stages
    # it keeps (held blocks of the same replica) as target stages held in place
    tgt = tuple(
        c for c in (_completed(r, sources, slot, model.num_layers) for r in tgt) if c is not None
    )
    if not tgt:
        return empty
    planned = {r.name for r in tgt}
    loads = [w for w in loads if w.block.replica_id in planned]
    try:
        plan = switch_plan.plan(src, tgt, model, link_model, remap=False)
    except fields.FieldError:  # blocks that do not fit the model's shape: no plan
        return empty
    by_target: dict[GpuRef, list[tuple[tuple[int, int], GpuRef | None]]] = {}
    for t in plan.transfers:
        by_target.setdefault(t.target, []).append((plan.shards[t.shard].units, t.source))
    parts: dict[Where, tuple[actions.SwitchPart, ...]] = {}
    for w in loads:
        dev = slot[(w.agent, w.block.key)]
        got = sorted(by_target.get(dev, []))
        parts[(w.agent, w.block.key)] = tuple(
            _part(units, by_slot[s] if s is not None else None, w) for units, s in _merge(got)
        )
    return Assignment(parts, plan, src, model)


def _device_index(device: str) -> int:
    """`cpu:0` -> 0, `cuda:3` -> 3 (an agent's devices are of one kind)."""
    tail = device.rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


def map_target(
    held: Sequence[Held],
    wanted: Sequence[Wanted],
    model: ModelBytes,
    pool: Mapping[str, Sequence[str]] | None = None,
) -> dict[tuple[str, str], tuple[str, str]]:
    """Where to put a target layout so that most of its bytes are already on the agent and
    device that will hold them (`policies.device_map`, exact over relabellings that keep
    each agent's devices together): `(agent, device)` as given -> `(agent, device)` to use.
    Here devices are physical (`(agent, device index)`), unlike `assign`: a block whose
    layers the same device holds copies them in memory. `pool`: the devices per agent
    (default: those the blocks name). For a caller that places the target itself (the
    switching loop); an explicit layout names its agents and is not remapped."""

    if not wanted or any(w.block.tp_size > 1 for w in wanted):
        return {(w.agent, w.block.device): (w.agent, w.block.device) for w in wanted}

    def ref(agent: str, b: blocks.Block) -> GpuRef:
        return (agent, _device_index(b.device))

    src = tuple(
        ReplicaPlacement(
            f"{h.agent}/{h.block.key}",
            (StagePlacement((h.block.start, h.block.end), (ref(h.agent, h.block),)),),
        )
        for h in held
        if _compatible(h.block, wanted[0].block)
    )
    replicas: dict[str, list[Wanted]] = {}
    for w in wanted:
        replicas.setdefault(w.block.replica_id, []).append(w)
    tgt = tuple(
        ReplicaPlacement(
            rid,
            tuple(
                StagePlacement((w.block.start, w.block.end), (ref(w.agent, w.block),))
                for w in sorted(ws, key=lambda w: w.block.stage_index)
            ),
        )
        for rid, ws in sorted(replicas.items())
    )
    every = [*((h.agent, h.block) for h in held), *((w.agent, w.block) for w in wanted)]
    names = {ref(agent, b): b.device for agent, b in every}
    devices: dict[str, set[int]] = {}
    if pool is not None:
        for agent, devs in pool.items():
            for d in devs:
                names[(agent, _device_index(d))] = d
                devices.setdefault(agent, set()).add(_device_index(d))
    else:
        for agent, idx in names:
            devices.setdefault(agent, set()).add(idx)
    pieces = shards.split(model, src, tgt)
    mapping = device_map.map_devices(
        tgt,
        shards.holdings(pieces, tgt, model.num_layers),
        shards.holdings(pieces, src, model.num_layers),
        [s.bytes for s in pieces],
        {agent: tuple(sorted(idx)) for agent, idx in devices.items()},
    )
    return {(a[0], names[a]): (b[0], names[b]) for a, b in mapping.items()}


def _completed(
    r: ReplicaPlacement, held: Sequence[Held], slot: Mapping[Where, GpuRef], num_layers: int
) -> ReplicaPlacement | None:
    """`r` with the stages its replica keeps (held as they are), or None when it still
    does not cover the model (its loads keep the transition planner's own rule)."""
    have = {(s.layers[0], s.layers[1]) for s in r.stages}
    start, end = r.stages[0].layers[0], r.stages[-1].layers[1]
    if start == 0 and end == num_layers:
        return r
    extra = [
        StagePlacement((h.block.start, h.block.end), (slot[(h.agent, h.block.key)],))
        for h in held
        if h.block.replica_id == r.name and (h.block.start, h.block.end) not in have
    ]
    stages = sorted([*r.stages, *extra], key=lambda s: s.layers[0])
    try:
        out = ReplicaPlacement(r.name, tuple(stages))
    except fields.FieldError:
        return None
    whole = out.stages[0].layers[0] == 0 and out.stages[-1].layers[1] == num_layers
    return out if whole else None


def _merge(
    got: Iterable[tuple[tuple[int, int], GpuRef | None]],
) -> list[tuple[tuple[int, int], GpuRef | None]]:
    """Adjacent unit ranges from one source as one range."""
    out: list[tuple[tuple[int, int], GpuRef | None]] = []
    for units, s in got:
        if out and out[-1][1] == s and out[-1][0][1] == units[0]:
            out[-1] = ((out[-1][0][0], units[1]), s)
        else:
            out.append((units, s))
    return out


def _part(units: tuple[int, int], h: Held | None, w: Wanted) -> actions.SwitchPart:
    if h is None:
        return actions.SwitchPart(units, None)
    peer = actions.PeerSource(
        h.agent,
        h.address,
        h.block.replica_id,
        h.block.stage_index,
        transport(h.agent, h.store_address, w.agent, w.store_address),
    )
    return actions.SwitchPart(units, peer)
