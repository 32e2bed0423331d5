"""KunServe drop plan: which replicas form cooperative pipelines to free KV memory.

Input: one model's replicas (the layers each holds), every layer's bytes, existing groups and
the bytes R the overload monitor says the queue needs. Output: a `DropPlan` (new groups, each
group's stages: which member keeps which layers, bytes freed per member) or a fallback
(preempt/recompute, advise scale-out) when no grouping frees R. Called by the overload loop
and `tessera bench overload`; the loop orders the replicas with `merge_order` (busy heads,
idle donors). Algorithm (KunServe Figure 6): a min-heap by group size; merge the two
smallest, counting one copy of the layers both held as freed, until freed >= R or one
group is left (short pipelines lose least). A group never has more members than layers. Stages:
k members over L layers cut into k contiguous stages minimising the slowest (a linear-partition
DP over per-layer costs, `layer_costs_from_profile`, uniform by default), matched to members
already holding every layer of their stage, so applying a plan only drops layers; without such
a matching each layer stays with a holder, in contiguous runs. docs/overload.md has more.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linear_sum_assignment

from tessera.cost import profile as profile_mod

REASON_DROP = "DropPlanned"
REASON_NOTHING = "NothingToFree"  # R <= 0: no plan needed
REASON_UNREACHABLE = "DropInsufficient"  # no grouping frees R: fall back


@dataclass(frozen=True)
class Replica:
    """One whole or partial replica: its name and the layer indices it holds now."""

    name: str
    layers: frozenset[int]


@dataclass(frozen=True)
class DropInput:
    """Everything the plan needs; `groups` empty = every replica alone."""

    replicas: tuple[Replica, ...]
    layer_bytes: tuple[int, ...]  # bytes of layer i's parameters (one copy)
    required_bytes: int  # R: KV bytes the queued requests need
    groups: tuple[tuple[str, ...], ...] = ()  # existing pipelines (member names)
    layer_cost: tuple[float, ...] = ()  # per-layer step cost for balancing; () = uniform
    first_extra_cost: float = 0.0  # embedding, paid by the stage holding layer 0
    last_extra_cost: float = 0.0  # final norm + LM head, paid by the last stage

    def __post_init__(self) -> None:
        names = [r.name for r in self.replicas]
        if len(set(names)) != len(names):
            raise ValueError(f"replicas: duplicate names in {names}")
        n = len(self.layer_bytes)
        for r in self.replicas:
            if not r.layers or min(r.layers) < 0 or max(r.layers) >= n:
                raise ValueError(f"replica {r.name}: layers must lie in [0, {n})")
        if self.layer_cost and len(self.layer_cost) != n:
            raise ValueError(f"layer_cost: needs {n} entries, got {len(self.layer_cost)}")
        if any(b < 0 for b in self.layer_bytes):
            raise ValueError("layer_bytes: must be >= 0")
        if self.groups:
            flat = [m for g in self.groups for m in g]
            if sorted(flat) != sorted(names):
                raise ValueError("groups: must list every replica exactly once")


@dataclass(frozen=True)
class Stage:
    """Layers [start, end) of a group's pipeline, kept by `replica`."""

    replica: str
    start: int
    end: int


@dataclass(frozen=True)
class Group:
    """One (possibly merged) group: members, pipeline stages in order, bytes freed."""

    members: tuple[str, ...]
    stages: tuple[Stage, ...]
    freed_bytes: int  # by the merges that formed this group in this plan
    changed: bool  # False: the group is as it was (nothing to apply)


@dataclass(frozen=True)
class DropPlan:
    """The decision: new groups, or a fallback with a reason and a message."""

    groups: tuple[Group, ...]
    required_bytes: int
    freed_bytes: int
    fallback: bool  # True: no drop; handle KV-centrically (preempt, recompute)
    reason: str  # REASON_*; the condition/event reason
    message: str
    freed_by_replica: dict[str, int] = field(default_factory=dict)  # bytes each member frees
    merges: int = 0


@dataclass(frozen=True)
class Candidate:
    """A whole replica a drop may merge, as the loop sees it now."""

    name: str
    fires: bool  # its demand crossed the drop threshold with a queue
    started: int  # requests with a token: what it must finish before it can be a donor


def merge_order(candidates: Sequence[Candidate]) -> tuple[str, ...]:
    """The order to hand `plan_drop`, which merges neighbours (0, 1), (2, 3), ... and makes
    the first of each pair the head. Heads are the firing and busiest replicas (their
    running requests keep going through the drop, their queue gets the grown pool); each
    is paired with the least busy replica left, its donor, which must drain its started
    requests before the head's pool can grow (a busy donor under a burst held a drop
    1.1 s; docs/overload.md). Ties by name."""
    ranked = sorted(candidates, key=lambda c: (not c.fires, -c.started, c.name))
    out: list[str] = []
    i, j = 0, len(ranked) - 1
    while i <= j:
        out.append(ranked[i].name)
        if i < j:
            out.append(ranked[j].name)
        i, j = i + 1, j - 1
    return tuple(out)


def plan_drop(inp: DropInput) -> DropPlan:
    """KunServe Figure 6 with stage assignment; see the module docstring."""
    by_name = {r.name: r for r in inp.replicas}
    groups = inp.groups or tuple((r.name,) for r in inp.replicas)
    layers_of = {g: frozenset().union(*(by_name[m].layers for m in g)) for g in groups}
    if inp.required_bytes <= 0:
        kept = tuple(_unchanged(g, by_name) for g in groups)
        return DropPlan(kept, inp.required_bytes, 0, False, REASON_NOTHING, "no queued demand")
    heap = [(len(g), i, g) for i, g in enumerate(groups)]
    heapq.heapify(heap)
    order = len(heap)
    freed, merges = 0, 0
    freed_of: dict[tuple[str, ...], int] = {}
    while len(heap) >= 2 and freed < inp.required_bytes:
        e0, e1 = heapq.heappop(heap), heapq.heappop(heap)
        g0, g1 = e0[2], e1[2]
        if len(g0) + len(g1) > len(layers_of[g0] | layers_of[g1]):
            # a member would hold no layer (and so no KV): the two smallest groups cannot
            # merge, so no two can
            heap += [e0, e1]
            break
        dup = layers_of[g0] & layers_of[g1]
        gained = sum(inp.layer_bytes[i] for i in dup)
        new = g0 + g1
        layers_of[new] = layers_of[g0] | layers_of[g1]
        freed_of[new] = freed_of.pop(g0, 0) + freed_of.pop(g1, 0) + gained
        freed += gained
        merges += 1
        heapq.heappush(heap, (len(new), order, new))
        order += 1
    if freed < inp.required_bytes:
        return DropPlan(
            tuple(_unchanged(g, by_name) for g in groups),
            inp.required_bytes,
            0,
            True,
            REASON_UNREACHABLE,
            f"dropping every duplicated layer frees {freed} bytes of the {inp.required_bytes} "
            "the queue needs: keeping replicas whole and preempting/recomputing; scale out",
        )
    out: list[Group] = []
    per_replica: dict[str, int] = {}
    for _, _, g in sorted(heap, key=lambda t: t[1]):
        if g not in freed_of:
            out.append(_unchanged(g, by_name))
            continue
        stages = assign_stages(g, by_name, inp)
        out.append(Group(g, stages, freed_of[g], True))
        for m in g:
            keep = {i for s in stages if s.replica == m for i in range(s.start, s.end)}
            per_replica[m] = sum(inp.layer_bytes[i] for i in by_name[m].layers - keep)
    return DropPlan(
        tuple(out),
        inp.required_bytes,
        freed,
        False,
        REASON_DROP,
        f"{merges} merge(s) free {freed} bytes for {inp.required_bytes} bytes of queued demand",
        per_replica,
        merges,
    )


def _unchanged(g: tuple[str, ...], by_name: dict[str, Replica]) -> Group:
    stages = []
    for m in g:
        for start, end in _runs(sorted(by_name[m].layers)):
            stages.append(Stage(m, start, end))
    stages.sort(key=lambda s: s.start)
    return Group(g, tuple(stages), 0, False)


def _runs(layers: Sequence[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for i in layers:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def balanced_cuts(costs: Sequence[float], k: int) -> list[tuple[int, int]]:
    """Cut `costs` (in order) into k contiguous non-empty parts minimising the largest
    part's sum (the pipeline's bottleneck stage); returns index ranges."""
    n = len(costs)
    if not 1 <= k <= n:
        raise ValueError(f"cannot cut {n} layers into {k} stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[j][i]: the smallest bottleneck of the first i layers in j parts
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(j, n - (k - j) + 1):
            for s in range(j - 1, i):
                v = max(best[j - 1][s], prefix[i] - prefix[s])
                if v < best[j][i] - 1e-12:
                    best[j][i], cut[j][i] = v, s
    parts, i = [], n
    for j in range(k, 0, -1):
        parts.append((cut[j][i], i))
        i = cut[j][i]
    return parts[::-1]


def assign_stages(
    members: tuple[str, ...], by_name: dict[str, Replica], inp: DropInput
) -> tuple[Stage, ...]:
    """Cut the group's layers into len(members) cost-balanced stages and give each to a
    member that already holds it (see the module docstring)."""
    layers = sorted(frozenset().union(*(by_name[m].layers for m in members)))
    k = min(len(members), len(layers))
    unit = inp.layer_cost or tuple(1.0 for _ in inp.layer_bytes)
    costs = [unit[i] for i in layers]
    if layers[0] == 0:
        costs[0] += inp.first_extra_cost
    if layers[-1] == len(inp.layer_bytes) - 1:
        costs[-1] += inp.last_extra_cost
    parts = [(layers[a], layers[b - 1] + 1) for a, b in balanced_cuts(costs, k)]
    # Deterministic matching of stages to members that hold them: stage i prefers member i
    # (the merge order), any holder costs 1, a non-holder is forbidden.
    big = float(len(parts) * len(members) + 1)
    cost = np.full((len(parts), len(members)), big)
    for i, (a, b) in enumerate(parts):
        for j, m in enumerate(members):
            if set(range(a, b)) <= by_name[m].layers:
                cost[i, j] = 0.0 if i == j else 1.0
    rows, cols = linear_sum_assignment(cost)
    if len(rows) == len(parts) and all(cost[r, c] < big for r, c in zip(rows, cols, strict=True)):
        by_stage = dict(zip(rows.tolist(), cols.tolist(), strict=True))
        return tuple(Stage(members[by_stage[i]], a, b) for i, (a, b) in enumerate(parts))
    return _keep_holders(layers, members, by_name)


def _keep_holders(
    layers: list[int], members: tuple[str, ...], by_name: dict[str, Replica]
) -> tuple[Stage, ...]:
    """Fallback assignment: each layer to a holder, preferring the previous layer's."""
    stages: list[Stage] = []
    for i in layers:
        prev = stages[-1] if stages else None
        if prev is not None and prev.end == i and i in by_name[prev.replica].layers:
            stages[-1] = Stage(prev.replica, prev.start, i + 1)
            continue
        holder = next(m for m in members if i in by_name[m].layers)
        stages.append(Stage(holder, i, i + 1))
    return tuple(stages)


def layer_costs_from_profile(
    prof: profile_mod.Profile, num_layers: int, batch: int, context: int
) -> tuple[tuple[float, ...], float]:
    """Per-layer decode-step seconds and the LM head's, for `DropInput.layer_cost` and
    `last_extra_cost` (the embedding lookup is negligible and left at 0)."""
    layer = prof.decode.seconds(batch, context, 1)
    return tuple(layer for _ in range(num_layers)), prof.lm_head_decode.seconds(batch, 0, 1)
