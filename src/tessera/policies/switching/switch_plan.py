"""Greedy parameter switch plan (OServe Algorithm 2): which device sends each shard where.

Input: the source placement (what runs now), the target placement, the model's bytes and a
:class:`~tessera.policies.device_links.DeviceLinks`. Shards are cut at the finest common
split of both placements (``policies.transition.shards``); the target is mapped onto
physical devices keeping the most bytes in place (``transition.device_map``, on by
default). Each shard a target device needs and lacks comes from a device holding it in the
source: same-node sources first, then the one whose link to the target carries the fewest
bytes so far (the paper's C[s→t]), then the fewest bytes sent in total, then the lowest
device; only a shard no device holds is read from storage. The plan's time is its busiest
resource's bytes over that resource's bandwidth. Old parameters stay until cut-over, so
every source holds its shards for the whole switch. Plain data, applied by the transition
executor; LP lower bound: ``switching.switch_bound``. Callers: the operator's switching
loop, ``tessera bench switch``, tests. docs/switching.md, "Switch plan".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera import fields
from tessera.policies import device_links, placement
from tessera.policies.device_links import DeviceLinks, GpuRef, Resource
from tessera.policies.placement import ModelBytes, ReplicaPlacement
from tessera.policies.transition import device_map, shards
from tessera.policies.transition.shards import Shard

RULES: tuple[str, ...] = ("pair", "sender")  # pair: OServe Algorithm 2


@dataclass(frozen=True)
class Transfer:
    """One shard copied to one target device."""

    shard: int  # index into SwitchPlan.shards
    source: GpuRef | None  # None: read from storage
    target: GpuRef
    tier: str  # "intra", "inter" or "storage"
    bytes: float


@dataclass(frozen=True)
class SwitchPlan:
    """The greedy plan and its modelled time."""

    shards: tuple[Shard, ...]
    target: tuple[ReplicaPlacement, ...]  # the target as placed on physical devices
    mapping: tuple[tuple[GpuRef, GpuRef], ...]  # (target device as given, physical device)
    transfers: tuple[Transfer, ...]
    bytes_in_place: float  # target bytes already on the right device
    bytes_by_tier: tuple[tuple[str, float], ...]  # moved bytes per tier
    link_bytes: tuple[tuple[Resource, float], ...]  # bytes per loaded resource
    seconds: float  # the busiest resource's time
    bottleneck: Resource | None  # that resource (None when nothing moves)

    @property
    def bytes_moved(self) -> float:
        """Bytes over device links (intra + inter), storage reads excluded."""
        tiers = dict(self.bytes_by_tier)
        return tiers.get(device_links.INTRA, 0.0) + tiers.get(device_links.INTER, 0.0)

    @property
    def bytes_from_storage(self) -> float:
        """Bytes read from storage."""
        return dict(self.bytes_by_tier).get(device_links.STORAGE, 0.0)

    def to_json(self) -> dict[str, Any]:
        """Summary for status, events and benches (transfers counted, not listed)."""
        return {
            "seconds": self.seconds,
            "bottleneck": resource_label(self.bottleneck) if self.bottleneck else None,
            "transfers": len(self.transfers),
            "shards": len(self.shards),
            "bytes_in_place": self.bytes_in_place,
            "bytes_by_tier": dict(self.bytes_by_tier),
            "busiest_links": {
                resource_label(r): b for r, b in sorted(self.link_bytes, key=lambda p: -p[1])[:8]
            },
        }


def resource_label(resource: Resource) -> str:
    """Text such as ``out/intra/node-0:3`` or ``storage``."""
    direction, tier, device = resource
    if device is None:
        return direction
    return f"{direction}/{tier}/{device[0]}:{device[1]}"


def _pool(
    source: tuple[ReplicaPlacement, ...],
    target: tuple[ReplicaPlacement, ...],
    pool: Mapping[str, tuple[int, ...]] | None,
) -> dict[str, tuple[int, ...]]:
    if pool is not None:
        return {node: tuple(idx) for node, idx in pool.items()}
    out: dict[str, set[int]] = {}
    for node, idx in placement.devices(source) + placement.devices(target):
        out.setdefault(node, set()).add(idx)
    return {node: tuple(sorted(idx)) for node, idx in out.items()}


def time_of(loads: Mapping[Resource, float], model: DeviceLinks) -> tuple[float, Resource | None]:
    """The busiest resource's time and that resource."""
    best: tuple[float, Resource | None] = (0.0, None)
    for resource in sorted(loads, key=repr):
        seconds = loads[resource] / device_links.capacity(model, resource)
        if seconds > best[0]:
            best = (seconds, resource)
    return best


def _sender_time(
    source: GpuRef,
    target: GpuRef,
    size: float,
    loads: Mapping[Resource, float],
    link_model: DeviceLinks,
) -> float:
    """The busiest of ``source``'s sending links after adding ``size`` bytes to them."""
    return max(
        (loads.get(r, 0.0) + size) / device_links.capacity(link_model, r)
        for r in device_links.resources(source, target, link_model.tier(source, target))
        if r[0] == "out"
    )


def plan(
    source: tuple[ReplicaPlacement, ...],
    target: tuple[ReplicaPlacement, ...],
    model: ModelBytes,
    link_model: DeviceLinks,
    remap: bool = True,
    pool: Mapping[str, tuple[int, ...]] | None = None,
    rule: str = "pair",
) -> SwitchPlan:
    """The greedy switch plan from ``source`` to ``target`` (module docstring)."""
    if rule not in RULES:
        raise fields.FieldError("rule", f"must be one of {', '.join(RULES)}")
    placement.check(source, model.num_layers, "source", complete=False)
    placement.check(target, model.num_layers, "target")
    pieces = shards.split(model, source, target)
    sizes = [s.bytes for s in pieces]
    held = shards.holdings(pieces, source, model.num_layers)
    if remap:
        needs_logical = shards.holdings(pieces, target, model.num_layers)
        mapping = device_map.map_devices(
            target, needs_logical, held, sizes, _pool(source, target, pool)
        )
        target = device_map.relabel(target, mapping)
    else:
        mapping = {d: d for d in placement.devices(target)}
    needs = shards.holdings(pieces, target, model.num_layers)
    owners = shards.holders(held, len(pieces))
    pair: dict[tuple[GpuRef, GpuRef], float] = {}
    sent: dict[GpuRef, float] = {}
    loads: dict[Resource, float] = {}
    moved: dict[str, float] = {}
    transfers: list[Transfer] = []
    in_place = 0.0
    for m, shard in enumerate(pieces):
        for t in sorted(d for d, want in needs.items() if m in want):
            if m in held.get(t, frozenset()):
                in_place += shard.bytes
                continue
            candidates = owners[m]
            if candidates:
                local = [s for s in candidates if s[0] == t[0]]
                pool_ = local or list(candidates)
                if rule == "pair":
                    s = min(pool_, key=lambda d: (pair.get((d, t), 0.0), sent.get(d, 0.0), d))
                else:
                    s = min(
                        pool_,
                        key=lambda d: (
                            _sender_time(d, t, shard.bytes, loads, link_model),
                            pair.get((d, t), 0.0),
                            d,
                        ),
                    )
                tier = link_model.tier(s, t)
                pair[(s, t)] = pair.get((s, t), 0.0) + shard.bytes
                sent[s] = sent.get(s, 0.0) + shard.bytes
                transfers.append(Transfer(m, s, t, tier, shard.bytes))
                src: GpuRef | None = s
            else:
                tier = device_links.STORAGE
                transfers.append(Transfer(m, None, t, tier, shard.bytes))
                src = None
            moved[tier] = moved.get(tier, 0.0) + shard.bytes
            for resource in device_links.resources(src, t, tier):
                loads[resource] = loads.get(resource, 0.0) + shard.bytes
    seconds, bottleneck = time_of(loads, link_model)
    return SwitchPlan(
        shards=pieces,
        target=target,
        mapping=tuple(sorted(mapping.items())),
        transfers=tuple(transfers),
        bytes_in_place=in_place,
        bytes_by_tier=tuple(sorted(moved.items())),
        link_bytes=tuple(sorted(loads.items(), key=lambda p: repr(p[0]))),
        seconds=seconds,
        bottleneck=bottleneck,
    )
