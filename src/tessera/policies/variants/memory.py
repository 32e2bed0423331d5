"""Parameter bytes of full fine-tunes' chains beside their foundation: what sharing saves.

A full fine-tune's chain mirrors a foundation replica's stages. On an agent holding the
foundation's pieces (the block zoo) it costs only its own units: layers that differ and were
not accepted as equivalent (`shareEquivalent`), and the embedding or final norm + head when
they differ; elsewhere, every unit of its stages. Units are `placement`'s (0 the embedding,
layer i is unit i + 1, L + 1 the final norm + lm_head); a stage of tp ranks holds 1/tp of each
unit per device. `fit_variants` places chains greedily into the bytes the foundation's devices
have left, showing how many variants a budget serves with and without sharing. Pure; called by
`variant_plan.with_full_chains` (a chain's planned `param_bytes`) and tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tessera import fields
from tessera.policies import placement


@dataclass(frozen=True)
class ChainSharing:
    """What a full fine-tune holds of its own (everything else is the foundation's)."""

    name: str
    own_layers: frozenset[int]  # decoder layers that differ and are not shared
    own_embedding: bool = False
    own_head: bool = False  # the final norm + lm_head

    def own_units(self, num_layers: int) -> frozenset[int]:
        for i in self.own_layers:
            if not 0 <= i < num_layers:
                raise fields.FieldError("own_layers", f"layer {i} outside [0, {num_layers})")
        units = {i + 1 for i in self.own_layers}
        if self.own_embedding:
            units.add(0)
        if self.own_head:
            units.add(num_layers + 1)
        return frozenset(units)


def from_report(name: str, report: Mapping[str, object]) -> ChainSharing:
    """The sharing an equivalence report (`status.variants[].equivalence` JSON) decided:
    its layers not shared are the chain's own (the embedding and head are assumed shared,
    as the report covers decoder layers only)."""
    rows = report.get("layers")
    if not isinstance(rows, list):
        raise fields.FieldError("equivalence.layers", "must be a list")
    own = frozenset(
        int(r["layer"]) for r in rows if isinstance(r, Mapping) and not r.get("shared", False)
    )
    return ChainSharing(name, own)


def chain_stage_bytes(
    model: placement.ModelBytes,
    stage: placement.StagePlacement,
    sharing: ChainSharing,
    foundation_held: bool = True,
) -> float:
    """Bytes per device (each of the stage's tp ranks) the chain's stage costs."""
    return chain_block_bytes(model, *stage.layers, stage.tp, sharing, foundation_held)


def chain_block_bytes(
    model: placement.ModelBytes,
    start: int,
    end: int,
    tp: int,
    sharing: ChainSharing,
    foundation_held: bool = True,
) -> float:
    """Bytes one rank of the chain's block for decoder layers [start, end) costs."""
    a, b = placement.StagePlacement((start, end), (("", 0),)).units(model.num_layers)
    own = sharing.own_units(model.num_layers) if foundation_held else None
    return sum(model.unit_bytes(u) for u in range(a, b) if own is None or u in own) / tp


@dataclass(frozen=True)
class VariantFit:
    """Which chains fit one foundation replica's devices, and the bytes they take."""

    fitted: tuple[str, ...]
    left_out: tuple[str, ...]
    used: Mapping[placement.GpuRef, float]  # bytes the fitted chains take per device

    @property
    def param_bytes(self) -> float:
        return sum(self.used.values())


def fit_variants(
    model: placement.ModelBytes,
    replica: placement.ReplicaPlacement,
    free: Mapping[placement.GpuRef, float],
    variants: Sequence[ChainSharing],
    shared: bool = True,
) -> VariantFit:
    """Greedily add each variant's chain (mirroring `replica`) while every device it
    touches has room. `shared=False` prices each chain as a full copy (no zoo)."""
    left = dict(free)
    used: dict[placement.GpuRef, float] = {}
    fitted: list[str] = []
    out: list[str] = []
    for v in variants:
        need: dict[placement.GpuRef, float] = {}
        for st in replica.stages:
            b = chain_stage_bytes(model, st, v, foundation_held=shared)
            for dev in st.devices:
                need[dev] = need.get(dev, 0.0) + b
        if all(left.get(d, 0.0) >= n for d, n in need.items()):
            for d, n in need.items():
                left[d] = left.get(d, 0.0) - n
                used[d] = used.get(d, 0.0) + n
            fitted.append(v.name)
        else:
            out.append(v.name)
    return VariantFit(tuple(fitted), tuple(out), used)
