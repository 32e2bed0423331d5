"""Parameter shards at the finest common split of two placements, and who holds each.

A shard is a unit range (``tessera.policies.placement``: embedding, layers, lm_head) times
a tensor slice ``[f0, f1)``. The unit breakpoints are every stage boundary of either
placement, and the slice breakpoints every ``r/tp`` of either placement's tp degrees, so
each stage rank of either side holds a whole number of shards and never a part of one.
Called by ``tessera.policies.switching.switch_plan`` (and its device mapping) and
``tessera.policies.switching.switch_bound``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from tessera.policies.placement import GpuRef, ModelBytes, ReplicaPlacement


@dataclass(frozen=True)
class Shard:
    """A unit range and tensor slice: the atom a switch moves."""

    units: tuple[int, int]  # [start, end): 0 embedding, 1..L layers, L+1 lm_head
    slice: tuple[Fraction, Fraction]  # [f0, f1) of each tensor
    bytes: float

    def label(self) -> str:
        """Compact text, e.g. ``u1-5[1/2:1]``."""
        return f"u{self.units[0]}-{self.units[1]}[{self.slice[0]}:{self.slice[1]}]"


Holdings = dict[GpuRef, frozenset[int]]  # device -> indices of the shards it holds


def _stage_slices(
    replicas: Iterable[ReplicaPlacement], num_layers: int
) -> Iterable[tuple[GpuRef, tuple[int, int], tuple[Fraction, Fraction]]]:
    for replica in replicas:
        for stage in replica.stages:
            units = stage.units(num_layers)
            for rank, device in enumerate(stage.devices):
                yield device, units, stage.slice_of(rank)


def split(model: ModelBytes, *placements: tuple[ReplicaPlacement, ...]) -> tuple[Shard, ...]:
    """The finest common split of ``placements`` (units × slices), in unit-major order."""
    unit_cuts = {0, model.num_layers + 2}
    slice_cuts = {Fraction(0), Fraction(1)}
    for replicas in placements:
        for _, units, piece in _stage_slices(replicas, model.num_layers):
            unit_cuts.update(units)
            slice_cuts.update(piece)
    ucuts, scuts = sorted(unit_cuts), sorted(slice_cuts)
    out = []
    for u0, u1 in itertools.pairwise(ucuts):
        unit_bytes = sum(model.unit_bytes(u) for u in range(u0, u1))
        for f0, f1 in itertools.pairwise(scuts):
            out.append(Shard((u0, u1), (f0, f1), unit_bytes * float(f1 - f0)))
    return tuple(out)


def holdings(
    shards: tuple[Shard, ...], replicas: tuple[ReplicaPlacement, ...], num_layers: int
) -> Holdings:
    """Which shards each device of ``replicas`` holds."""
    held: dict[GpuRef, set[int]] = {}
    for device, units, piece in _stage_slices(replicas, num_layers):
        mine = held.setdefault(device, set())
        for i, shard in enumerate(shards):
            if (
                units[0] <= shard.units[0]
                and shard.units[1] <= units[1]
                and piece[0] <= shard.slice[0]
                and shard.slice[1] <= piece[1]
            ):
                mine.add(i)
    return {d: frozenset(s) for d, s in held.items()}


def holders(held: Holdings, count: int) -> tuple[tuple[GpuRef, ...], ...]:
    """For each shard index, the devices holding it (sorted)."""
    out: list[list[GpuRef]] = [[] for _ in range(count)]
    for device in sorted(held):
        for i in held[device]:
            out[i].append(device)
    return tuple(tuple(d) for d in out)
