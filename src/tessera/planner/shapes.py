"""Replica shapes: a (tp, pp) layout and how many whole nodes it spans.

A replica is ``pp`` stages of ``tp`` GPUs each. Placement rule (documented in
docs/planner.md, "Search space"): a replica of at most one node's GPUs lives inside one
node (``span == 1``, NVLink hops only); a larger one covers ``span`` whole nodes with
``pp / span`` stages on each (inter-node hops between nodes). Tensor parallelism never
leaves a node, and ``tp`` divides the attention and the KV head counts. Called by
``tessera.planner.capacity_table`` and ``tessera.planner.deployment``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tessera import fields
from tessera.cost.model_shape import ModelShape


@dataclass(frozen=True, order=True)
class Shape:
    """A replica's parallel layout; ordered by (gpus, span, tp, pp) via :meth:`sort_key`."""

    tp: int  # tensor-parallel degree (GPUs per stage)
    pp: int  # pipeline stages
    span: int = 1  # whole nodes covered (1: inside a single node)

    def __post_init__(self) -> None:
        if self.tp < 1 or self.pp < 1 or self.span < 1:
            raise fields.FieldError("shape", f"tp, pp and span must be >= 1: {self}")
        if self.pp % self.span:
            raise fields.FieldError("shape", f"pp must be a multiple of span: {self}")

    @property
    def gpus(self) -> int:
        """GPUs the replica occupies."""
        return self.tp * self.pp

    @property
    def stages_per_node(self) -> int:
        """Pipeline stages on each node."""
        return self.pp // self.span

    def node_gpus(self) -> int:
        """For a spanning shape, the GPU count of each node it covers."""
        return self.gpus // self.span

    def sort_key(self) -> tuple[int, int, int, int]:
        """Canonical order: fewer GPUs first, then fewer nodes, smaller tp."""
        return (self.gpus, self.span, self.tp, self.pp)

    def label(self) -> str:
        """Short text form, e.g. ``tp2pp2`` or ``tp8pp4@2n``."""
        base = f"tp{self.tp}pp{self.pp}"
        return base if self.span == 1 else f"{base}@{self.span}n"


def tp_degrees(model: ModelShape, max_tp: int) -> tuple[int, ...]:
    """TP degrees up to ``max_tp`` dividing both the attention and the KV head counts."""
    return tuple(
        t for t in range(1, max_tp + 1) if model.num_heads % t == 0 and model.num_kv_heads % t == 0
    )


def enumerate_shapes(
    model: ModelShape, node_sizes: Counter[int], max_pp: int, max_tp: int = 0
) -> tuple[Shape, ...]:
    """All structurally valid shapes for nodes of the given sizes (size -> node count).

    ``max_tp`` caps the TP degree (0: up to the node size), e.g. for an engine without TP."""
    pp_cap = min(max_pp, model.num_layers)
    out: set[Shape] = set()
    for size, count in node_sizes.items():
        for tp in tp_degrees(model, min(size, max_tp) if max_tp else size):
            for pp in range(1, min(pp_cap, size // tp) + 1):
                out.add(Shape(tp, pp, 1))
            if size % tp:
                continue
            per_node = size // tp
            for span in range(2, count + 1):
                pp = per_node * span
                if pp > pp_cap:
                    break
                out.add(Shape(tp, pp, span))
    return tuple(sorted(out, key=Shape.sort_key))


def fits_node(shape: Shape, node_size: int) -> bool:
    """Whether ``shape`` can live on nodes of ``node_size`` GPUs."""
    if shape.span == 1:
        return shape.gpus <= node_size
    return shape.node_gpus() == node_size


def copies_within(inner: Shape, outer: Shape) -> int:
    """How many replicas of ``inner`` fit in the GPUs one ``outer`` replica occupies."""
    if outer.span == 1:
        return outer.gpus // inner.gpus if inner.span == 1 else 0
    node = outer.node_gpus()
    if inner.span == 1:
        return outer.span * (node // inner.gpus)
    if inner.node_gpus() == node and inner.span <= outer.span:
        return outer.span // inner.span
    return 0
