"""Homogeneous baseline: the best single replica shape copied over the cluster.

For each feasible shape, fill every node (or every group of ``span`` nodes) with as many
copies as fit and score the result; the best is the baseline the heterogeneous search
must beat and one of its starting points. Called by ``search`` and the benchmark.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tessera.planner import layout as layout_mod
from tessera.planner.capacity_table import CapacityTable
from tessera.planner.evaluate import Evaluation, Evaluator
from tessera.planner.layout import Layout, NodeConfig
from tessera.planner.shapes import Shape


@dataclass(frozen=True)
class Candidate:
    """A homogeneous layout and its score."""

    shape: Shape
    layout: Layout
    evaluation: Evaluation


def replicate(table: CapacityTable, shape: Shape) -> Layout:
    """Copies of ``shape`` on every node group it fits; other nodes stay idle."""
    groups = []
    for size, nodes in sorted(table.node_sizes.items(), reverse=True):
        configs: Counter[NodeConfig] = Counter()
        spans: Counter[Shape] = Counter()
        if shape.span == 1 and shape.gpus <= size:
            configs[layout_mod.node_config([shape] * (size // shape.gpus))] = nodes
        elif shape.span > 1 and shape.node_gpus() == size and shape.span <= nodes:
            spans[shape] = nodes // shape.span
            idle = nodes - spans[shape] * shape.span
            if idle:
                configs[()] = idle
        else:
            configs[()] = nodes
        groups.append(layout_mod.make_group(size, nodes, configs, spans))
    return Layout(tuple(groups))


def ranked(table: CapacityTable, evaluator: Evaluator) -> list[Candidate]:
    """Every feasible shape replicated, best score first (ties: canonical shape order)."""
    out = []
    for shape in sorted(table.infos, key=Shape.sort_key):
        if not any(r > 0 for r in table.rates(shape)):
            continue
        layout = replicate(table, shape)
        if layout.replicas() == 0:
            continue
        out.append(Candidate(shape, layout, evaluator(layout)))
    out.sort(key=lambda c: -c.evaluation.score)  # stable: canonical order breaks ties
    return out
