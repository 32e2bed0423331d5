"""Stitched chains in the converge pass (issue 35): the placement's inputs and the status.

The shell of `tessera.policies.variants.stitch_chains` (which decides). `place` gathers what the
placement needs from the observed agents and the target so far: each agent's room (its
device's capacity less every planned block there, other deployments' blocks, and the
stitched chains it already holds), the pieces it holds or will hold (the block zoo shares
them), and where loaded chains are (they stay). `observe` reads each stitched chain's
front block (`ListBlocks`: `BlockInfo.stitch`, the stitch as loaded with the quality the
zoo measured at its point) for `status.variants[].stitch`, and `lines` says which agent
holds which block. Called by `converge.converge` (operator and `tessera up`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tessera import blocks, observed, variant_spec
from tessera.control import variants as variant_ops
from tessera.policies import placement
from tessera.policies.transition import model as transition_model
from tessera.policies.variants import plan as variant_plan
from tessera.policies.variants import stitch_chains
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb

Facts = Callable[[str], placement.ModelBytes | None]  # a checkpoint's bytes per unit


def place(
    target: transition_model.Target,
    chosen: Sequence[variant_spec.VariantSpec],
    model_path: str,
    facts: Facts,
    obs: observed.Observed,
    prefix: str,
) -> stitch_chains.StitchPlacement:
    """`target` with every stitch variant's chains placed (module docstring)."""
    stitched = [v for v in chosen if v.kind == "stitch"]
    model = facts(model_path)
    if not stitched or model is None:
        return stitch_chains.StitchPlacement(target, (), (), "locality")
    small = {v.path: m for v in stitched if (m := facts(v.path)) is not None}
    models = {model_path: model, **small}
    chain_ids = {
        variant_plan.variant_replica_id(rid, v.name)
        for rid in {r.id for r in target.replicas}
        for v in stitched
    }
    rooms, held = agent_rooms(target, models, obs, prefix, frozenset(chain_ids))
    return stitch_chains.with_stitch_chains(
        target, chosen, model_path, model, small, rooms, held, hop_bytes=1.0
    )


def agent_rooms(
    target: transition_model.Target,
    models: Mapping[str, placement.ModelBytes],
    obs: observed.Observed,
    prefix: str,
    chain_ids: frozenset[str],
) -> tuple[list[stitch_chains.AgentRoom], dict[str, dict[int, str]]]:
    """Each reachable agent's room for the chains `chain_ids`: its device's capacity less
    every planned block of `target` there, other deployments' blocks and the chains it
    holds (module docstring); and where loaded chain blocks are (chain -> stage -> agent)."""
    ids = {b.replica_id for b in (p.block for p in target.blocks)}
    held: dict[str, dict[int, str]] = {}
    rooms = []
    for a in obs.agents:
        if not a.reachable or not a.devices:
            continue
        mine = [p for p in target.blocks if p.agent == a.name and p.block.replica_id in ids]
        device = mine[0].block.device if mine else a.devices[0].id
        dev = next((d for d in a.devices if d.id == device), a.devices[0])
        used = 0.0
        holds: set[stitch_chains.Unit] = set()
        for p in mine:
            b = p.block
            m = models.get(b.model_path)
            params = b.param_bytes or (
                stitch_chains.block_bytes(b.model_path, m, b.start, b.end, frozenset())
                if m is not None
                else 0.0
            )
            used += params + b.kv_bytes if b.device == dev.id else 0.0
            if m is not None:
                holds.update((b.model_path, u) for u in stitch_chains.units(m, b.start, b.end))
        for b in a.blocks:
            if b.replica_id in chain_ids:  # a chain already loaded stays
                held.setdefault(b.replica_id, {})[b.stage_index] = a.name
            if b.device == dev.id and (
                b.replica_id in chain_ids or not b.replica_id.startswith(prefix)
            ):
                used += b.param_bytes + b.kv_bytes
        rooms.append(
            stitch_chains.AgentRoom(
                a.name, a.address, dev.id, dev.capacity_bytes - used, frozenset(holds)
            )
        )
    return rooms, held


def lines(target: transition_model.Target, variant: str, chain_ids: Sequence[str]) -> list[str]:
    """Which agent holds which block of the variant's chains (from the target)."""
    out = []
    for rid in chain_ids:
        got = {
            p.block.stage_index: p
            for p in target.blocks
            if p.block.replica_id == rid and p.block.tp_rank == 0
        }
        if 0 not in got or 1 not in got:
            out.append(f"{rid}: no agent has room for its blocks")
            continue
        out.append(stitch_chains.chain_place(variant, got[0], got[1]).line())
    return out


async def observe(
    target: transition_model.Target, variant_of: Mapping[str, str], tls: transport.TlsFiles | None
) -> dict[str, dict[str, object]]:
    """{variant: `status.variants[].stitch`}, from the first loaded front block of its chains."""
    out: dict[str, dict[str, object]] = {}
    async for name, b, info in variant_ops.variant_blocks(
        target, variant_of, lambda name, b: name not in out and bool(b.stitch_zoo), tls
    ):
        if info.HasField("stitch"):
            out[name] = stitch_json(info.stitch, b)
    return out


def stitch_json(m: pb.BlockStitch, front: blocks.Block) -> dict[str, object]:
    """`status.variants[].stitch`: the agent's report (one conversion, here)."""
    return {
        "point": [front.end, m.next_layer_start],
        "cosine": round(m.cosine, 4),
        "top1Agreement": round(m.top1_agreement, 4),
        "paramBytes": m.param_bytes,
        "folder": m.folder,
        "measuredAgainst": "the model alone, on the zoo's held-out set",
    }
