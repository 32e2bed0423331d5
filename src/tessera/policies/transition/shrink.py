"""Room on a full device: shrink the serving replicas' KV pools, load beside them, grow
the new pools once the old are gone (OServe switching on a full cluster).

`make_room`, called by `policies.transition.plan` when make-before-break has no room and
`World.resize_kv` (alone first, then for what the freeing order leaves short), shrinks the KV
pools of old routed replicas on the short devices (`actions.ResizeKV`, compacting live pages)
never below their requests' pages plus `World.kv_headroom`, by what the new blocks' parameters
and `ASK_NEW_KV_SHARE` of their KV need, and gives the new blocks the budget then free (at least
`MIN_NEW_KV_SHARE` of the target's). `grow` restores the new pools to the target's budgets
after the old replicas are unloaded. Too little room even at the floors: blocked `WaitingForKV`
(requests hold the pages; re-plans later) or `InsufficientMemory` (parameters alone do not
fit). Pure; used only by `policies.transition`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from tessera import observed
from tessera.policies.transition import actions, model
from tessera.policies.transition import steps as transition_steps

MIN_NEW_KV_SHARE = 0.05  # a new block loads with at least this share of its target KV
# ... and the old pools shrink to give it this share (old and new both serve meanwhile:
# shrinking the old to its floor would starve it for the whole load)
ASK_NEW_KV_SHARE = 0.5
GROW_SLACK = 0.02  # a pool this close to its target is not grown (pages round budgets down)


def _load(obs: observed.Observed, rid: str) -> observed.ReplicaLoad | None:
    for a in obs.agents:
        if a.reachable:
            for k in a.kv:
                if k.replica_id == rid:
                    return k
    return None


def floor_pages(load: observed.ReplicaLoad, headroom: float) -> int:
    """The fewest pages a replica's pool may shrink to: what its requests hold, plus a
    share of it for their next tokens (at least one page while any request runs or waits)."""
    busy = 1 if load.running or load.waiting else 0
    want = math.ceil(load.pages_used * (1.0 + headroom)) + busy
    return min(load.pages_total, max(1, want))


def page_bytes_per_layer(sim: transition_steps.StepBuilder) -> float:
    """KV bytes of one page of one layer, from any observed replica of this deployment."""
    for p, step in sim.present.values():
        if step is not None or not sim.ours(p.block.replica_id) or not p.block.kv_bytes:
            continue
        load = _load(sim.world.observed, p.block.replica_id)
        if load is not None and load.pages_total > 0:
            return p.block.kv_bytes / load.pages_total / (p.block.end - p.block.start)
    return 0.0


def full_need(todo: list[model.Placed]) -> dict[model.DevKey, int]:
    """Bytes the blocks take with their whole KV budgets (make-before-break)."""
    need: dict[model.DevKey, int] = {}
    for p in todo:
        k = (p.agent, p.block.device)
        need[k] = need.get(k, 0) + p.block.bytes
    return need


def _need(todo: list[model.Placed]) -> dict[model.DevKey, int]:
    """Bytes to make room for: the parameters and `ASK_NEW_KV_SHARE` of the KV."""
    need: dict[model.DevKey, int] = {}
    for p in todo:
        k = (p.agent, p.block.device)
        need[k] = need.get(k, 0) + p.block.param_bytes + int(p.block.kv_bytes * ASK_NEW_KV_SHARE)
    return need


def _shrink(
    sim: transition_steps.StepBuilder, rid: str, short: Mapping[model.DevKey, int]
) -> tuple[bool, bool]:
    """Shrink one old replica's pool towards covering `short`; (shrunk, held at its floor)."""
    load = _load(sim.world.observed, rid)
    held = sim.held(rid)
    if load is None or load.pages_total <= 0 or not held:
        return False, False
    total = sim.pages.get(rid, load.pages_total)
    floor = min(total, floor_pages(load, sim.world.kv_headroom))
    release = 0
    for dev, bytes_short in short.items():
        per_page = sum(p.block.kv_bytes for p in held if (p.agent, p.block.device) == dev) / total
        if per_page > 0:
            release = max(release, math.ceil(bytes_short / per_page))
    if release == 0:
        return False, False
    keep = max(floor, total - release)
    at_floor = total - release < floor and bool(load.pages_used or load.running or load.waiting)
    if keep >= total:
        return False, at_floor
    stages = []
    for p in held:
        kv = p.block.kv_bytes * keep // total
        dev = (p.agent, p.block.device)
        sim.free[dev] = sim.free.get(dev, 0) + p.block.kv_bytes - kv
        sim.ours_bytes -= p.block.kv_bytes - kv
        new = replace(p, block=replace(p.block, kv_bytes=kv))
        sim.present[(p.agent, p.block.key)] = (new, sim.present[(p.agent, p.block.key)][1])
        stages.append(actions.KVStage(p.agent, p.address, new.block))
    sid = sim.add(actions.ResizeKV(rid, keep, total, tuple(stages)), sim.resizes.get(rid, []))
    sim.pages[rid] = keep
    sim.resizes.setdefault(rid, []).append(sid)
    for p in held:  # loads on these devices wait for the memory the shrink frees
        sim.unloads_on.setdefault((p.agent, p.block.device), []).append(sid)
    sim.shrunk += 1
    return True, at_floor


def make_room(
    sim: transition_steps.StepBuilder,
    rid: str,
    todo: list[model.Placed],
    target_ids: set[str],
) -> tuple[list[model.Placed], model.Blocked | None]:
    """Shrink old routed replicas' pools until `todo`'s parameters fit with some KV; the
    blocks to load (their KV budgets cut to what is free) or why not (module docstring)."""
    at_floor: list[str] = []
    for r in list(sim.routed):
        short = sim.deficit(_need(todo))
        if not short:
            break
        if r.id in target_ids or not sim.ours(r.id):
            continue
        _, floored = _shrink(sim, r.id, short)
        if floored:
            at_floor.append(r.id)
    params: dict[model.DevKey, int] = {}
    kv_want: dict[model.DevKey, int] = {}
    for p in todo:
        k = (p.agent, p.block.device)
        params[k] = params.get(k, 0) + p.block.param_bytes
        kv_want[k] = kv_want.get(k, 0) + p.block.kv_bytes
    out: list[model.Placed] = []
    for p in todo:
        k = (p.agent, p.block.device)
        room = sim.free.get(k, 0) - params[k]
        n_here = sum(1 for q in todo if (q.agent, q.block.device) == k)
        share = p.block.kv_bytes / kv_want[k] if kv_want[k] else 1.0 / n_here
        kv = min(p.block.kv_bytes or room, int(room * share)) if room > 0 else 0
        least = max(1, int(p.block.kv_bytes * MIN_NEW_KV_SHARE))
        if kv < least:
            # waiting helps only if the pools at their floor hold what is missing: when
            # the parameters do not fit even with those pools empty, no wait makes room
            pooled = sum(
                q.block.kv_bytes
                for q, _ in sim.present.values()
                if q.block.replica_id in at_floor and (q.agent, q.block.device) == k
            )
            waiting = bool(at_floor) and sim.free.get(k, 0) + pooled >= params[k] + least
            why = (
                f"the pools of {', '.join(at_floor)} hold pages their requests need; "
                "waiting for them to finish or move"
                if waiting
                else "even with the old replicas' KV pools shrunk"
            )
            return todo, model.Blocked(
                "WaitingForKV" if waiting else "InsufficientMemory",
                f"replica {rid} needs {params[k]} parameter bytes and {least} KV bytes on "
                f"{k[0]}/{k[1]}, which has {sim.free.get(k, 0)} free: {why}",
            )
        out.append(replace(p, block=replace(p.block, kv_bytes=kv)))
    return out, None


def _pages(stages: Sequence[model.Placed | actions.KVStage], bpl: float) -> int:
    """The pages a replica's allocator gets from its stages' KV budgets (the smallest)."""
    return min(round(s.block.kv_bytes / (bpl * (s.block.end - s.block.start))) for s in stages)


def grow(sim: transition_steps.StepBuilder, target: model.Target, after: list[int]) -> None:
    """Grow the target replicas' pools to the target's KV budgets where memory is free
    now (a new replica loaded with a cut budget, once the old replicas are unloaded)."""
    bpl = page_bytes_per_layer(sim)
    by_rid: dict[str, list[model.Placed]] = {}
    for p in target.blocks:
        by_rid.setdefault(p.block.replica_id, []).append(p)
    for rid, want in by_rid.items():
        have = [sim.present.get((p.agent, p.block.key)) for p in want]
        if any(h is None for h in have) or not all(p.block.kv_bytes for p in want):
            continue
        cur = [h[0] for h in have if h is not None]
        pairs = list(zip(cur, want, strict=True))
        if bpl > 0:  # the allocator's pages: a stage with fewer layers may hold more
            if _pages(cur, bpl) >= _pages(want, bpl) * (1 - GROW_SLACK):
                continue
        elif all(c.block.kv_bytes >= p.block.kv_bytes * (1 - GROW_SLACK) for c, p in pairs):
            continue
        frac = 1.0
        extra: dict[model.DevKey, int] = {}
        for c, p in pairs:
            k = (c.agent, c.block.device)
            extra[k] = extra.get(k, 0) + max(0, p.block.kv_bytes - c.block.kv_bytes)
        for k, n in extra.items():
            if n:
                frac = min(frac, max(0, sim.free.get(k, 0)) / n)
        kvs = [
            c.block.kv_bytes + int(max(0, p.block.kv_bytes - c.block.kv_bytes) * frac)
            for c, p in pairs
        ]
        grown = [
            replace(c, block=replace(c.block, kv_bytes=kv))
            for (c, _), kv in zip(pairs, kvs, strict=True)
        ]
        if bpl > 0 and _pages(grown, bpl) <= _pages(cur, bpl):
            continue  # not one more page for the allocator: nothing to gain
        if bpl <= 0 and all(
            kv - c.block.kv_bytes < GROW_SLACK * p.block.kv_bytes
            for (c, p), kv in zip(pairs, kvs, strict=True)
        ):
            continue
        stages = []
        deps = list(after)
        for (c, _), new in zip(pairs, grown, strict=True):
            k = (c.agent, c.block.device)
            kv = new.block.kv_bytes
            sim.free[k] = sim.free.get(k, 0) - (kv - c.block.kv_bytes)
            sim.ours_bytes += kv - c.block.kv_bytes
            stages.append(actions.KVStage(c.agent, c.address, new.block))
            step = sim.present[(c.agent, c.block.key)][1]
            sim.present[(c.agent, c.block.key)] = (new, step)
            deps += sim.unloads_on.get(k, [])
            if step is not None:
                deps.append(step)
        pages = _pages(stages, bpl) if bpl > 0 else 0
        load = _load(sim.world.observed, rid)
        was = sim.pages.get(rid, load.pages_total if load is not None else 0)
        sim.add(actions.ResizeKV(rid, max(pages, was), was, tuple(stages)), deps)
        sim.peak_bytes = max(sim.peak_bytes, sim.ours_bytes)
