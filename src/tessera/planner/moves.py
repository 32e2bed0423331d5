"""Neighbourhood of a layout for the flow-guided local search.

A move removes, per unit, some node configurations and spanning replicas from one
node-size group and adds others over the same nodes; ``apply`` repeats it ``m`` times (``m``
doubles while the move keeps improving). Kinds: reshape / split / grow (one replica on a
node changes shape, freed GPUs refilled); transfer (two replicas on a node give their GPUs
to a larger one); pair (the same across two nodes, the rest repacked first-fit
decreasing); clone (copy another node configuration of the layout); price (the best
configuration under the current dual prices); span / unspan (whole nodes join into a
multi-node replica, or one is broken up). Flow-guided: the makespan LP's class prices
``y_j`` value a shape s at ``max_j y_j cap[s][j]``; refills pick the best-valued shapes by
a small knapsack and candidates are tried by predicted value gain. Called by
``tessera.planner.search``; docs/planner.md, "Deployment search".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from tessera.planner import layout as layout_mod
from tessera.planner.capacity_table import CapacityTable
from tessera.planner.layout import GroupLayout, Layout, NodeConfig
from tessera.planner.shapes import Shape


@dataclass(frozen=True)
class Move:
    """Per unit: drop ``remove`` node configs / ``remove_spans`` and add the others."""

    kind: str  # reshape | transfer | pair | clone | price | span | unspan
    group: int  # index into Layout.groups
    remove: tuple[NodeConfig, ...]  # node configurations leaving (one node each)
    add: tuple[NodeConfig, ...]  # node configurations arriving (one node each)
    remove_spans: tuple[Shape, ...] = ()
    add_spans: tuple[Shape, ...] = ()
    gain: float = 0.0  # predicted value gain per unit, from dual prices
    available: int = 1  # largest number of units the layout allows


def shape_values(table: CapacityTable, prices: tuple[float, ...]) -> dict[Shape, float]:
    """Dual value of one replica of each kept shape: max_j price_j * cap_j."""
    return {
        s: max((p * r for p, r in zip(prices, table.rates(s), strict=True)), default=0.0)
        for s in table.kept
    }


def best_fill(
    free: int, shapes: tuple[Shape, ...], values: Mapping[Shape, float]
) -> tuple[float, NodeConfig]:
    """Most valuable multiset of ``shapes`` within ``free`` GPUs (unbounded knapsack)."""
    best: list[tuple[float, tuple[Shape, ...]]] = [(0.0, ())] * (max(free, 0) + 1)
    for g in range(1, free + 1):
        best[g] = best[g - 1]
        for shape in shapes:
            if shape.gpus <= g:
                value, items = best[g - shape.gpus]
                value += values.get(shape, 0.0)
                if value > best[g][0] + 1e-15:
                    best[g] = (value, (*items, shape))
    value, items = best[max(free, 0)]
    return value, layout_mod.node_config(items)


def config_value(config: NodeConfig, values: Mapping[Shape, float]) -> float:
    """Sum of the shape values of a node configuration."""
    return sum(values.get(s, 0.0) for s in config)


def _without(config: NodeConfig, *drop: Shape) -> list[Shape]:
    rest = list(config)
    for shape in drop:
        rest.remove(shape)
    return rest


def node_targets(
    config: NodeConfig, node_gpus: int, shapes: tuple[Shape, ...], values: Mapping[Shape, float]
) -> list[tuple[str, NodeConfig]]:
    """Configurations one reshape/split/grow or transfer away from ``config``."""
    out: list[tuple[str, NodeConfig]] = []

    def complete(kind: str, kept: list[Shape], new: Shape) -> None:
        free = node_gpus - sum(s.gpus for s in kept) - new.gpus
        if free < 0:
            return
        _, fill = best_fill(free, shapes, values)
        out.append((kind, layout_mod.node_config([*kept, new, *fill])))

    distinct = sorted(set(config), key=Shape.sort_key)
    for shape in distinct:
        rest = _without(config, shape)
        for new in shapes:
            if new != shape:
                complete("reshape", rest, new)
    for i, first in enumerate(distinct):
        for second in distinct[i:]:
            if first == second and config.count(first) < 2:
                continue
            rest = _without(config, first, second)
            floor = max(first.gpus, second.gpus)
            for new in shapes:
                if new.gpus > floor:
                    complete("transfer", rest, new)
    used = sum(s.gpus for s in config)
    if used < node_gpus:
        _, fill = best_fill(node_gpus - used, shapes, values)
        if fill:
            out.append(("reshape", layout_mod.node_config([*config, *fill])))
    return out


def pack_two(
    items: list[Shape], node_gpus: int, shapes: tuple[Shape, ...], values: Mapping[Shape, float]
) -> tuple[NodeConfig, NodeConfig] | None:
    """First-fit-decreasing of ``items`` into two nodes, free GPUs refilled; None if no fit."""
    bins: list[list[Shape]] = [[], []]
    loads = [0, 0]
    for item in sorted(items, key=lambda s: (-s.gpus, s.sort_key())):
        for b in (0, 1):
            if loads[b] + item.gpus <= node_gpus:
                bins[b].append(item)
                loads[b] += item.gpus
                break
        else:
            return None
    for b in (0, 1):
        bins[b].extend(best_fill(node_gpus - loads[b], shapes, values)[1])
    first, second = (layout_mod.node_config(b) for b in bins)
    return first, second


def neighbours(table: CapacityTable, layout: Layout, prices: tuple[float, ...]) -> list[Move]:
    """All moves from ``layout`` with their predicted gains (not yet ordered)."""
    values = shape_values(table, prices)
    moves: list[Move] = []
    for gi, group in enumerate(layout.groups):
        moves.extend(_group_moves(table, gi, group, values))
    return moves


def _config_key(config: NodeConfig) -> list[tuple[int, int, int, int]]:
    return [s.sort_key() for s in config]


def _group_moves(
    table: CapacityTable, gi: int, group: GroupLayout, values: Mapping[Shape, float]
) -> list[Move]:
    size = group.node_gpus
    shapes = table.local_shapes(size)
    counts = dict(group.configs)
    present = [c for c, _ in group.configs]
    _, priced = best_fill(size, shapes, values)
    moves: list[Move] = []
    seen: set[tuple[tuple[NodeConfig, ...], tuple[NodeConfig, ...]]] = set()

    def add(kind: str, remove: tuple[NodeConfig, ...], new: tuple[NodeConfig, ...]) -> None:
        key = (tuple(sorted(remove, key=_config_key)), tuple(sorted(new, key=_config_key)))
        if key[0] == key[1] or key in seen:
            return
        seen.add(key)
        need = Counter(remove)
        available = min(counts[c] // n for c, n in need.items())
        if available < 1:
            return
        gain = sum(config_value(c, values) for c in new) - sum(
            config_value(c, values) for c in remove
        )
        moves.append(Move(kind, gi, remove, new, gain=gain, available=available))

    for config in present:
        for kind, target in node_targets(config, size, shapes, values):
            add(kind, (config,), (target,))
        for other in present:
            add("clone", (config,), (other,))
        add("price", (config,), (priced,))
        for span in table.span_shapes(size, group.nodes):
            if counts[config] >= span.span:
                gain = values.get(span, 0.0) - span.span * config_value(config, values)
                moves.append(
                    Move(
                        "span",
                        gi,
                        (config,) * span.span,
                        (),
                        add_spans=(span,),
                        gain=gain,
                        available=counts[config] // span.span,
                    )
                )
    for i, first in enumerate(present):
        for second in present[i:]:
            for a in sorted(set(first), key=Shape.sort_key):
                for b in sorted(set(second), key=Shape.sort_key):
                    rest = _without(first, a) + _without(second, b)
                    for new in shapes:
                        if max(a.gpus, b.gpus) < new.gpus <= a.gpus + b.gpus:
                            packed = pack_two([*rest, new], size, shapes, values)
                            if packed is not None:
                                add("pair", (first, second), packed)
    for span, count in group.spans:
        for target in sorted({priced, *present}, key=_config_key):
            gain = span.span * config_value(target, values) - values.get(span, 0.0)
            moves.append(
                Move(
                    "unspan",
                    gi,
                    (),
                    (target,) * span.span,
                    remove_spans=(span,),
                    gain=gain,
                    available=count,
                )
            )
    return moves


def apply(layout: Layout, move: Move, m: int) -> Layout:
    """Apply ``move`` ``m`` times."""
    group = layout.groups[move.group]
    configs: Counter[NodeConfig] = Counter(dict(group.configs))
    spans: Counter[Shape] = Counter(dict(group.spans))
    for config in move.remove:
        configs[config] -= m
    for config in move.add:
        configs[config] += m
    for span in move.remove_spans:
        spans[span] -= m
    for span in move.add_spans:
        spans[span] += m
    new = layout_mod.make_group(group.node_gpus, group.nodes, configs, spans)
    return layout.with_group(move.group, new)
