"""LP lower bound on a switch's time: fractional sources, minimise the busiest link.

For the target as the switch plan placed it (same shards, same in-place bytes), every
(shard m, target device t) that must move may be split over *all* devices holding m, on
any tier, in any fractions y[m,t,s] >= 0 with sum_s y = bytes(m). Shards no device holds
come from storage as in the plan (a constant load). Minimise T subject to, for every
resource r of ``tessera.policies.device_links``, load_r / bandwidth_r <= T. The greedy plan is
one feasible point of this LP (integral, intra-node first), so ``greedy / bound >= 1``
always, and the bound is what any source choice could reach for that target placement.
Solved with ``scipy.optimize.linprog(method="highs")``. Callers: ``tessera bench switch``,
the switching loop (to report ``plan_vs_bound``), tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize, sparse

from tessera.policies import device_links
from tessera.policies.device_links import DeviceLinks, Resource
from tessera.policies.placement import ModelBytes, ReplicaPlacement
from tessera.policies.switching.switch_plan import SwitchPlan
from tessera.policies.transition import shards

GB = 1e9  # the LP works in GB and GB/s so its coefficients stay near 1


@dataclass(frozen=True)
class SwitchBound:
    """The LP optimum."""

    seconds: float  # lower bound on the plan's time
    bottleneck: Resource | None  # a resource at the optimum's busiest time


def bound(
    source: tuple[ReplicaPlacement, ...],
    switch: SwitchPlan,
    model: ModelBytes,
    link_model: DeviceLinks,
) -> SwitchBound:
    """The LP lower bound for ``switch``'s target placement (module docstring)."""
    pieces = switch.shards
    held = shards.holdings(pieces, source, model.num_layers)
    needs = shards.holdings(pieces, switch.target, model.num_layers)
    owners = shards.holders(held, len(pieces))
    constant: dict[Resource, float] = {}
    columns: list[tuple[int, list[Resource]]] = []  # (shard, loaded resources) per variable
    groups: list[list[int]] = []  # variables of one (m, t) demand
    for target in sorted(needs):
        for m in sorted(needs[target]):
            if m in held.get(target, frozenset()):
                continue
            size = pieces[m].bytes / GB
            if not owners[m]:
                for r in device_links.resources(None, target, device_links.STORAGE):
                    constant[r] = constant.get(r, 0.0) + size
                continue
            group = []
            for s in owners[m]:
                group.append(len(columns))
                columns.append(
                    (m, list(device_links.resources(s, target, link_model.tier(s, target))))
                )
            groups.append(group)
    index: dict[Resource, int] = {}
    for _, loaded in columns:
        for r in loaded:
            index.setdefault(r, len(index))
    for r in constant:
        index.setdefault(r, len(index))
    if not index:
        return SwitchBound(0.0, None)
    n = len(columns)
    rows, cols, vals = [], [], []
    for j, (_, loaded) in enumerate(columns):
        for r in loaded:
            rows.append(index[r])
            cols.append(j)
            vals.append(1.0 / (device_links.capacity(link_model, r) / GB))
    for i in index.values():  # -T on every resource row
        rows.append(i)
        cols.append(n)
        vals.append(-1.0)
    a_ub = sparse.csr_matrix((vals, (rows, cols)), shape=(len(index), n + 1))
    b_ub = np.zeros(len(index))
    for r, load in constant.items():
        b_ub[index[r]] = -load / (device_links.capacity(link_model, r) / GB)
    erows, ecols, b_eq = [], [], []
    for g, group in enumerate(groups):
        for j in group:
            erows.append(g)
            ecols.append(j)
        b_eq.append(pieces[columns[group[0]][0]].bytes / GB)
    a_eq = (
        sparse.csr_matrix(([1.0] * len(erows), (erows, ecols)), shape=(len(groups), n + 1))
        if groups
        else None
    )
    cost = np.zeros(n + 1)
    cost[n] = 1.0
    res = optimize.linprog(
        cost,
        A_ub=a_ub,
        b_ub=b_ub,
        A_eq=a_eq,
        b_eq=np.asarray(b_eq) if groups else None,
        bounds=[(0.0, None)] * (n + 1),
        method="highs",
    )
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed on the switch bound: {res.message}")
    seconds = float(res.x[n])
    slack = a_ub @ res.x - b_ub
    tight = int(np.argmax(slack))
    by_row = {i: r for r, i in index.items()}
    return SwitchBound(seconds, by_row[tight])


def ratio(switch: SwitchPlan, lower: SwitchBound) -> float:
    """Greedy time over the bound (1.0 when nothing moves)."""
    if lower.seconds <= 0:
        return 1.0 if switch.seconds <= 0 else float("inf")
    return switch.seconds / lower.seconds
