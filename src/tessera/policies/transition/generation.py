"""Layout generations: which replicas keep their id and which get a new one.

A replica whose layout changes gets a new replica id (`blocks.replica_id(..., g)`) so
its new blocks load beside the old ones and the gateway's routes stay opaque strings.
`assign()` decides, from observation only (level-triggered): a desired replica keeps the
newest generation `g` whose held blocks of the same name all agree with its desired
stages (agent, device, layers, stage count), so a transition interrupted half-way resumes
with the same ids; otherwise it gets `1 + ` the newest generation seen (held blocks, or
the routes version published, `floor`). The plan generation is the largest of the
replicas' generations and `floor`, so the routes version never goes back.
Called by `tessera.plan.make_plan`. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tessera import blocks, observed

# (agent, device, start, end) of a stage, and optionally the (agent, device) of its
# tensor-parallel ranks 1..tp-1 (a stage's tp is 1 + their count).
StageWhere = tuple[str, str, int, int] | tuple[str, str, int, int, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Generations:
    per_replica: Mapping[str, int]  # replica name -> generation
    plan: int  # the plan's generation (the routes version)


def assign(
    deployment: str,
    layouts: Sequence[tuple[str, Sequence[StageWhere]]],
    obs: observed.Observed,
    model: tuple[str, str],
    floor: int = 0,
) -> Generations:
    """`deployment` is "<namespace>.<name>"; `layouts` (replica name, stages) in order;
    `model` (checkpoint path, dtype): a block of another model or dtype never agrees."""
    held: dict[tuple[str, int], list[tuple[str, blocks.Block]]] = {}
    newest = floor
    for a in obs.agents:
        for b in a.blocks:
            rn = blocks.parse_replica_id(b.replica_id)
            if rn.deployment != deployment:
                continue
            held.setdefault((rn.name, rn.generation), []).append((a.name, b))
            newest = max(newest, rn.generation)
    fresh = newest + 1
    out: dict[str, int] = {}
    for name, stages in layouts:
        gens = sorted((g for (n, g) in held if n == name), reverse=True)
        keep = next((g for g in gens if _agrees(held[(name, g)], stages, model)), None)
        out[name] = keep if keep is not None else fresh
    return Generations(out, max([floor, *out.values()]) if out else floor)


def _agrees(
    have: list[tuple[str, blocks.Block]], stages: Sequence[StageWhere], model: tuple[str, str]
) -> bool:
    for agent, b in have:
        if (b.model_path, b.dtype) != model:
            return False
        if b.num_stages != len(stages) or not 0 <= b.stage_index < len(stages):
            return False
        where = stages[b.stage_index]
        ranks: tuple[tuple[str, str], ...] = where[4] if len(where) == 5 else ()
        places = ((where[0], where[1]), *ranks)
        if (b.start, b.end) != (where[2], where[3]) or b.tp_size != len(places):
            return False
        if b.tp_rank >= len(places) or (agent, b.device) != places[b.tp_rank]:
            return False
    return True
