"""The search state: which replica shapes each node holds, up to node symmetry.

Nodes with the same GPU count are interchangeable, so a layout records, per node size,
how many nodes carry each *node configuration* (a multiset of single-node shapes) and how
many multi-node replicas of each spanning shape exist. The objective depends only on the
multiset of shapes (``shape_counts``), which keeps the search's evaluations cheap and
cacheable. ``tessera.planner.deployment`` turns a layout into concrete GPUs. Used by
``search``, ``moves``, ``exhaustive`` and ``homogeneous``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from tessera import fields
from tessera.planner.shapes import Shape

NodeConfig = tuple[Shape, ...]  # shapes on one node, sorted by Shape.sort_key


def node_config(items: Iterable[Shape]) -> NodeConfig:
    """Canonical (sorted) node configuration."""
    return tuple(sorted(items, key=Shape.sort_key))


def config_gpus(config: NodeConfig) -> int:
    """GPUs a node configuration occupies."""
    return sum(s.gpus for s in config)


@dataclass(frozen=True)
class GroupLayout:
    """Layout of all nodes with ``node_gpus`` GPUs each."""

    node_gpus: int
    nodes: int
    configs: tuple[tuple[NodeConfig, int], ...]  # (configuration, node count), sorted
    spans: tuple[tuple[Shape, int], ...]  # (spanning shape, replica count), sorted

    def __post_init__(self) -> None:
        used = sum(n for _, n in self.configs) + sum(s.span * n for s, n in self.spans)
        if used != self.nodes:
            raise fields.FieldError("layout", f"covers {used} nodes, expected {self.nodes}")
        for config, count in self.configs:
            if count < 1 or config_gpus(config) > self.node_gpus:
                raise fields.FieldError("layout", f"config {config} does not fit {self.node_gpus}")
            if any(s.span != 1 for s in config):
                raise fields.FieldError("layout", "node configurations hold single-node shapes")
        for shape, count in self.spans:
            if count < 1 or shape.span < 2 or shape.node_gpus() != self.node_gpus:
                raise fields.FieldError("layout", f"span {shape} does not fit {self.node_gpus}")


def make_group(
    node_gpus: int, nodes: int, configs: Counter[NodeConfig], spans: Counter[Shape]
) -> GroupLayout:
    """Build a canonical :class:`GroupLayout` from counters (zero counts dropped)."""
    cfg = tuple(sorted(((c, n) for c, n in configs.items() if n > 0), key=_config_key))
    spn = tuple(sorted(((s, n) for s, n in spans.items() if n > 0), key=lambda p: p[0].sort_key()))
    # An empty node (no shape fits) is recorded as the empty configuration.
    return GroupLayout(node_gpus, nodes, cfg, spn)


def _config_key(pair: tuple[NodeConfig, int]) -> tuple[tuple[int, int, int, int], ...]:
    return tuple(s.sort_key() for s in pair[0])


@dataclass(frozen=True)
class Layout:
    """Per node-size groups, largest nodes first."""

    groups: tuple[GroupLayout, ...]

    def shape_counts(self) -> tuple[tuple[Shape, int], ...]:
        """Replicas per shape across the whole layout, in canonical order."""
        counts: Counter[Shape] = Counter()
        for group in self.groups:
            for config, n in group.configs:
                for shape in config:
                    counts[shape] += n
            for shape, n in group.spans:
                counts[shape] += n
        return tuple(sorted(counts.items(), key=lambda p: p[0].sort_key()))

    def replicas(self) -> int:
        """Total replica count."""
        return sum(n for _, n in self.shape_counts())

    def with_group(self, index: int, group: GroupLayout) -> Layout:
        """Copy with group ``index`` replaced."""
        groups = list(self.groups)
        groups[index] = group
        return Layout(tuple(groups))

    def label(self) -> str:
        """Compact text such as ``4x[tp2pp1 tp2pp1] + 1x tp8pp2@2n``."""
        parts = []
        for group in self.groups:
            for config, n in group.configs:
                inner = " ".join(s.label() for s in config) or "idle"
                parts.append(f"{n}x[{inner}]")
            for shape, n in group.spans:
                parts.append(f"{n}x {shape.label()}")
        return " + ".join(parts)
