"""Module-scaling decisions as layer-run operations the agents execute.

Input: Algorithm 1's `Replicate` actions (one layer onto one device each) or Algorithm
2's plan (`Migrate`, `Evict`, `ReduceBatch`), from `module_scaling.py`. Output: `RunOp`s
over runs of consecutive layers, which is what an agent replicates, migrates or evicts
(`ScalingReplicate` / `ScalingMigrate` / `ScalingEvict`): one op per maximal run per
device, cut so that any two runs are equal or disjoint (the engine splits the batch once
per run, so partially overlapping runs cannot both exist). Called by the scaling driver
(`tessera/control/scaling_driver.py`) and `tessera bench scaling`; pure.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tessera.policies.scaling import module_scaling as ms


@dataclass(frozen=True)
class RunOp:
    op: str  # "replicate" | "migrate" | "evict" | "reduce_batch"
    start: int = 0  # global layers [start, end)
    end: int = 0
    target: str = ""  # replicate / migrate: the device to take the run
    holder: str = ""  # migrate / evict: the device whose copy goes
    batch: int = 0  # reduce_batch: the new batch size


def runs_of(layers: Iterable[int]) -> list[tuple[int, int]]:
    """Maximal runs [start, end) of consecutive layer indices."""
    out: list[tuple[int, int]] = []
    for i in sorted(set(layers)):
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def _cut(runs: Sequence[tuple[int, int]], cuts: set[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in runs:
        edges = [a, *sorted(c for c in cuts if a < c < b), b]
        out += list(itertools.pairwise(edges))
    return out


def aligned_runs(by_device: Mapping[str, Iterable[int]]) -> dict[str, list[tuple[int, int]]]:
    """Each device's layers as runs, cut at every other run's edges: any two runs of the
    result are equal or disjoint."""
    runs = {d: runs_of(ls) for d, ls in by_device.items()}
    cuts = {e for rs in runs.values() for r in rs for e in r}
    return {d: _cut(rs, cuts) for d, rs in runs.items()}


def replicate_ops(actions: Sequence[ms.Replicate]) -> list[RunOp]:
    """Algorithm 1's per-layer replicas as run replications (device order kept)."""
    by_device: dict[str, list[int]] = {}
    for a in actions:
        by_device.setdefault(a.device, []).append(a.layer)
    return [
        RunOp("replicate", s, e, target=d)
        for d, rs in aligned_runs(by_device).items()
        for s, e in rs
    ]


def scale_down_ops(
    plan: ms.ScaleDownPlan, module_layers: Mapping[str, tuple[int, int]]
) -> list[RunOp]:
    """Algorithm 2's plan in its phase order: migrations (each module names its layers in
    `module_layers`), then evictions grouped into runs per device, then batch cuts."""
    out: list[RunOp] = []
    evicted: dict[str, list[int]] = {}
    for a in plan.actions:
        if isinstance(a, ms.Migrate):
            if a.module not in module_layers:
                raise ValueError(f"module {a.module!r}: its layers are not known")
            s, e = module_layers[a.module]
            out.append(RunOp("migrate", s, e, target=a.target, holder=a.source))
        elif isinstance(a, ms.Evict):
            evicted.setdefault(a.device, []).append(a.layer)
    for d, rs in aligned_runs(evicted).items():
        out += [RunOp("evict", s, e, holder=d) for s, e in rs]
    out += [
        RunOp("reduce_batch", batch=a.after) for a in plan.actions if isinstance(a, ms.ReduceBatch)
    ]
    return out
