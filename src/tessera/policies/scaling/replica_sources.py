"""Sources of a new replica's blocks: the switch plan's parts, refined by the host caches
and the measured links.

`switch_sources.assign` chooses a peer block or storage for every unit range of a block to load
(0 the embedding, 1..L the layers, L+1 final norm and head); `refine` applies what only the
agents know: (1) units the target agent's host cache holds (`observed.AgentInfo.host_cache`)
come from there (`host`, the fastest); (2) a gRPC peer part whose measured link
(`links.LinkModel.pairs`) is slower than the target's measured storage read is read from
storage; (3) while it shortens the load, the last unit of the slowest gRPC part moves to
storage (`balance`). Data-plane parts keep the plan's choice (the probe measures gRPC only). A
cached piece matches by model path and dtype ("auto" takes any: the agent checks digests).
Tensor-parallel blocks keep the planner's rule. Pure; called by `policies.transition_steps`;
docs/scaling.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from tessera import blocks, dtypes, observed
from tessera.policies import links
from tessera.policies.placement import ModelBytes
from tessera.policies.transition import actions
from tessera.policies.transition import copy_sources as switch_sources

HOST = "host"  # the part's source is the target agent's own host block cache

Where = switch_sources.Where


def unit_of(piece: str, num_layers: int) -> int | None:
    """`embed` -> 0, `layer.<i>` -> i + 1, `final` -> L + 1; None for anything else."""
    if piece == "embed":
        return 0
    if piece == "final":
        return num_layers + 1
    head, _, idx = piece.partition(".")
    if head == "layer" and idx.isdigit() and int(idx) < num_layers:
        return int(idx) + 1
    return None


def cached_units(
    pieces: Iterable[observed.CachedPiece], block: blocks.Block, num_layers: int
) -> frozenset[int]:
    """Units of `block`'s model a host cache holds in a dtype the block can use."""
    out = set()
    for p in pieces:
        if p.model_path != block.model_path:
            continue
        if block.dtype != dtypes.AUTO and p.dtype != block.dtype:
            continue
        u = unit_of(p.piece, num_layers)
        if u is not None:
            out.add(u)
    return frozenset(out)


def _slower_than_storage(link_model: links.LinkModel, source: str, target: str) -> bool:
    pair = link_model.pairs.get((source, target))
    store = link_model.storage.get(target)
    return pair is not None and store is not None and store > pair


def refine(
    parts: Mapping[Where, tuple[actions.SwitchPart, ...]],
    wanted: Sequence[switch_sources.Wanted],
    cache: Mapping[str, Sequence[observed.CachedPiece]],
    link_model: links.LinkModel,
    model: ModelBytes,
) -> dict[Where, tuple[actions.SwitchPart, ...]]:
    """The parts of every block to load (module docstring); blocks absent from the
    result load as the planner decides without parts."""
    out = dict(parts)
    num_layers = model.num_layers
    for w in wanted:
        if w.block.tp_size != 1:
            continue
        where = (w.agent, w.block.key)
        u0, u1 = switch_sources.units_of(w.block, num_layers)
        have = cached_units(cache.get(w.agent, ()), w.block, num_layers)
        plan = parts.get(where)
        if plan is None and not have.intersection(range(u0, u1)):
            continue
        per_unit: list[tuple[int, actions.PeerSource | None]] = []
        for part in plan or (actions.SwitchPart((u0, u1), None),):
            src = part.source
            if (
                src is not None
                and src.transport == switch_sources.GRPC
                and _slower_than_storage(link_model, src.agent, w.agent)
            ):
                src = None
            for u in range(*part.units):
                per_unit.append((u, _host(w) if u in have else src))
        per_unit = balance(per_unit, w.agent, link_model, model)
        out[where] = tuple(_merged(per_unit))
    return out


def balance(
    per_unit: list[tuple[int, actions.PeerSource | None]],
    target: str,
    link_model: links.LinkModel,
    model: ModelBytes,
) -> list[tuple[int, actions.PeerSource | None]]:
    """Move units from the peer that finishes last to storage while that shortens the
    load (step 3 of the module docstring); unchanged unless the target's storage rate
    and the peers' links are measured."""
    store = link_model.storage.get(target)
    if store is None:
        return per_unit
    units = dict(per_unit)

    def finish() -> dict[str, float]:
        t: dict[str, float] = {"": 0.0}  # "" = storage
        for u, src in units.items():
            if src is None:
                t[""] += model.unit_bytes(u) / store
            elif src.transport == switch_sources.GRPC:
                rate = link_model.pairs.get((src.agent, target))
                if rate is None:
                    return {}  # a link not measured: the plan stands
                t[src.agent] = t.get(src.agent, 0.0) + model.unit_bytes(u) / rate
        return t

    while True:
        t = finish()
        peers = {a: x for a, x in t.items() if a}
        if not peers:
            return sorted(units.items())
        slowest = max(peers, key=lambda a: peers[a])
        last = max(u for u, src in units.items() if src is not None and src.agent == slowest)
        was = units[last]
        units[last] = None
        if max(finish().values()) >= max(t.values()):
            units[last] = was  # no shorter: keep it
            return sorted(units.items())


def _host(w: switch_sources.Wanted) -> actions.PeerSource:
    return actions.PeerSource(w.agent, w.address, "", 0, HOST)


def _merged(
    per_unit: Iterable[tuple[int, actions.PeerSource | None]],
) -> list[actions.SwitchPart]:
    out: list[actions.SwitchPart] = []
    for u, src in sorted(per_unit, key=lambda x: x[0]):
        if out and out[-1].source == src and out[-1].units[1] == u:
            out[-1] = actions.SwitchPart((out[-1].units[0], u + 1), src)
        else:
            out.append(actions.SwitchPart((u, u + 1), src))
    return out
