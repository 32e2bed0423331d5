"""Map a target deployment onto physical devices so that the most bytes stay in place.

Any relabelling that keeps each node's devices together serves the same, but decides how many
bytes a switch moves. Solved exactly over those relabellings as two nested assignment problems
(``scipy.optimize.linear_sum_assignment``): inner, per (target node, physical node), match
devices maximising the bytes each target device already finds in place; outer, match nodes
maximising the inner optima. The objective is separable per device, so the nested solution is
the optimum over all node-preserving relabellings. Ties prefer the identity (a bonus far below
one shard), so a canonical target stays as given. Called by
``tessera.policies.switching.switch_plan``; docs/switching.md.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from scipy import optimize

from tessera import fields
from tessera.policies.placement import GpuRef, ReplicaPlacement, StagePlacement
from tessera.policies.transition.shards import Holdings

INFEASIBLE = -1e300


def _by_node(devices: list[GpuRef] | tuple[GpuRef, ...]) -> dict[str, list[GpuRef]]:
    out: dict[str, list[GpuRef]] = {}
    for device in sorted(devices):
        out.setdefault(device[0], []).append(device)
    return out


def _inner(
    wanted: list[GpuRef],
    physical: list[GpuRef],
    needs: Holdings,
    held: Holdings,
    sizes: list[float],
    bonus: float,
) -> tuple[float, dict[GpuRef, GpuRef]]:
    weights = np.zeros((len(wanted), len(physical)))
    for i, t in enumerate(wanted):
        for j, p in enumerate(physical):
            common = needs.get(t, frozenset()) & held.get(p, frozenset())
            weights[i, j] = sum(sizes[m] for m in common) + (bonus if p == t else 0.0)
    rows, cols = optimize.linear_sum_assignment(weights, maximize=True)
    value = float(weights[rows, cols].sum())
    return value, {wanted[int(r)]: physical[int(c)] for r, c in zip(rows, cols, strict=True)}


def map_devices(
    target: tuple[ReplicaPlacement, ...],
    needs: Holdings,
    held: Holdings,
    sizes: list[float],
    pool: Mapping[str, tuple[int, ...]],
) -> dict[GpuRef, GpuRef]:
    """Logical target device -> physical device (module docstring). ``needs`` are the
    target's holdings, ``held`` the source's, ``sizes`` the shard bytes, ``pool`` the
    physical devices per node."""
    logical = _by_node(sorted({d for r in target for s in r.stages for d in s.devices}))
    physical = {node: [(node, i) for i in sorted(idx)] for node, idx in pool.items()}
    bonus = 1e-9 * (sum(sizes) + 1.0) / (len(needs) + 1)
    t_nodes, p_nodes = sorted(logical), sorted(physical)
    if len(p_nodes) < len(t_nodes):
        raise fields.FieldError(
            "target", f"needs {len(t_nodes)} nodes, the pool has {len(p_nodes)}"
        )
    values = np.full((len(t_nodes), len(p_nodes)), INFEASIBLE)
    inner: dict[tuple[int, int], dict[GpuRef, GpuRef]] = {}
    for i, m in enumerate(t_nodes):
        for j, n in enumerate(p_nodes):
            if len(physical[n]) < len(logical[m]):
                continue
            value, matched = _inner(logical[m], physical[n], needs, held, sizes, bonus)
            values[i, j] = value + (bonus * len(logical[m]) if m == n else 0.0)
            inner[(i, j)] = matched
    rows, cols = optimize.linear_sum_assignment(values, maximize=True)
    mapping: dict[GpuRef, GpuRef] = {}
    for r, c in zip(rows, cols, strict=True):
        if (int(r), int(c)) not in inner:
            raise fields.FieldError(
                "target", f"node {t_nodes[int(r)]!r} needs more devices than any free node has"
            )
        mapping.update(inner[(int(r), int(c))])
    return mapping


def relabel(
    target: tuple[ReplicaPlacement, ...], mapping: Mapping[GpuRef, GpuRef]
) -> tuple[ReplicaPlacement, ...]:
    """``target`` with every device replaced by its image."""
    return tuple(
        ReplicaPlacement(
            r.name,
            tuple(StagePlacement(s.layers, tuple(mapping[d] for d in s.devices)) for s in r.stages),
        )
        for r in target
    )
