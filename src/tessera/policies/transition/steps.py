"""The transition planner's step builder: simulated memory, blocks and routes as steps
are written, and the retirement of old replicas when memory is short.

Used only by `tessera.policies.transition.planner.plan`; pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from tessera import routes_doc
from tessera.policies import device_links
from tessera.policies.placement import ModelBytes
from tessera.policies.scaling import replica_sources
from tessera.policies.transition import actions, model
from tessera.policies.transition import copy_sources as switch_sources


class StepBuilder:
    """The simulated state the steps are written against: memory, blocks, routes."""

    def __init__(self, world: model.World, target: model.Target) -> None:
        self.world, self.target = world, target
        obs = world.observed
        self.reachable = {a.name: a for a in obs.agents if a.reachable}
        self.free: dict[model.DevKey, int] = {}
        for a in self.reachable.values():
            for d in a.devices:
                self.free[(a.name, d.id)] = d.free_bytes
        if world.memory is not None:
            self.free.update(world.memory)
        # every block held (any deployment: peers), with the step that loads it (None: held)
        self.present: dict[model.Where, tuple[model.Placed, int | None]] = {
            (a.name, b.key): (model.Placed(a.name, a.address, b), None)
            for a in self.reachable.values()
            for b in a.blocks
        }
        self.readers: dict[model.Where, list[int]] = {}  # loads copying from a block
        self.steps: list[actions.Step] = []
        self.unloads_on: dict[model.DevKey, list[int]] = {}
        self.routed: list[routes_doc.RouteReplica] = (
            list(world.published.replicas) if world.published is not None else []
        )
        self.route_steps: list[int] = []
        self.ours_bytes = sum(
            p.block.bytes for p, _ in self.present.values() if self.ours(p.block.replica_id)
        )
        self.start_bytes = self.peak_bytes = self.ours_bytes
        self.retired = 0
        self.shrunk = 0  # KV pools shrunk to make room (`transition_shrink`)
        self.pages: dict[str, int] = {}  # replica -> its pool after a planned resize
        self.resizes: dict[str, list[int]] = {}  # replica -> its resize steps
        self.parts: dict[model.Where, tuple[actions.SwitchPart, ...]] = {}
        self.switch: switch_sources.Assignment | None = None

    def ours(self, rid: str) -> bool:
        return rid.startswith(self.world.owner_prefix)

    def add(self, action: actions.Action, after: Iterable[int] = ()) -> int:
        sid = len(self.steps)
        self.steps.append(actions.Step(sid, action, tuple(sorted(set(after)))))
        return sid

    # -- replicas and memory --------------------------------------------------------
    def held(self, rid: str) -> list[model.Placed]:
        return sorted(
            (p for p, _ in self.present.values() if p.block.replica_id == rid),
            key=lambda p: -p.block.stage_index,
        )

    def complete(self, rid: str) -> bool:
        held = self.held(rid)
        return bool(held) and {p.block.stage_index for p in held} == set(
            range(held[0].block.num_stages)
        )

    def deficit(self, need: Mapping[model.DevKey, int]) -> dict[model.DevKey, int]:
        return {k: n - self.free.get(k, 0) for k, n in need.items() if n > self.free.get(k, 0)}

    # -- actions ----------------------------------------------------------------------
    def retire(self, rid: str, after: list[int]) -> list[int]:
        """Drain a replica no route names, then unload its blocks; the unload step ids."""
        drain_deadline = (
            self.world.published.drain_deadline_s
            if self.world.published is not None
            else self.world.drain.deadline_s
        )
        drain = self.add(actions.Drain(rid, drain_deadline), after)
        out = []
        for p in self.held(rid):
            out.append(self.unload(p, [drain]))
        return out

    def unload(self, p: model.Placed, after: list[int]) -> int:
        where = (p.agent, p.block.key)
        _, loaded_by = self.present.pop(where)
        deps = list(after) + self.readers.pop(where, [])
        if loaded_by is not None:
            deps.append(loaded_by)
        sid = self.add(actions.UnloadBlock(p.agent, p.address, p.block), deps)
        dev = (p.agent, p.block.device)
        self.free[dev] = self.free.get(dev, 0) + p.block.bytes
        self.unloads_on.setdefault(dev, []).append(sid)
        self.ours_bytes -= p.block.bytes
        return sid

    def plan_switch(self, loads: list[model.Placed]) -> None:
        """With switch sourcing: the parts of every block to load, from one switch plan
        over the blocks held now (`policies.switch_sources`), refined by the agents' host
        caches and measured links (`policies.replica_sources`)."""
        if self.world.sourcing != "switch" or not loads:
            return
        stores = {a.name: a.store_address for a in self.reachable.values()}
        held = [
            switch_sources.Held(p.agent, p.address, p.block, stores.get(p.agent, ""))
            for p, step in self.present.values()
            if step is None
        ]
        wanted = [
            switch_sources.Wanted(p.agent, p.address, p.block, stores.get(p.agent, ""))
            for p in loads
        ]
        self.switch = switch_sources.assign(
            held, wanted, self.model_bytes(loads), device_links.from_agent_links(self.world.links)
        )
        model = self.model_bytes(loads)
        cache = {a.name: a.host_cache for a in self.reachable.values() if a.host_cache}
        self.parts = replica_sources.refine(
            self.switch.parts, wanted, cache, self.world.links, model
        )

    def model_bytes(self, loads: list[model.Placed]) -> ModelBytes:
        if self.world.model is not None:
            return self.world.model
        # a last stage ends at the model's last layer
        model_path = loads[0].block.model_path
        every = [*loads, *(p for p, _ in self.present.values())]
        num_layers = max(
            p.block.end
            for p in every
            if p.block.model_path == model_path and (p.block.is_last or p in loads)
        )
        return ModelBytes(num_layers, 1.0, 1.0, 1.0)  # no shape: every unit alike

    def _parts(self, p: model.Placed) -> tuple[actions.SwitchPart, ...] | None:
        """The switch plan's parts for `p` while every peer they name is still held."""
        parts = self.parts.get((p.agent, p.block.key))
        if not parts:
            return None
        for part in parts:
            if part.source is None or part.source.transport == replica_sources.HOST:
                if not self.world.checkpoint_readable:
                    return None  # storage is where a host part falls back to
                continue
            key = (part.source.replica_id, part.source.stage_index, 0)
            held = self.present.get((part.source.agent, key))
            if held is None or held[1] is not None:
                return None  # freed to make room (freeing order): the planner's own rule
        return parts

    def source(self, p: model.Placed) -> tuple[model.Placed, int | None] | None:
        """The fastest peer holding `p`'s tensors, when it beats reading storage."""
        if self.world.sourcing == "storage" and self.world.checkpoint_readable:
            return None
        links_, nbytes = self.world.links, p.block.param_bytes
        best: tuple[float, model.Placed, int | None] | None = None
        for have, step in self.present.values():
            if step is not None:
                continue  # only blocks held now: a copy never waits for another load
            if have.block.key == p.block.key and have.agent == p.agent:
                continue
            if have.block.holds(p.block):
                t = links_.copy_seconds(have.agent, p.agent, nbytes)
                if best is None or t < best[0]:
                    best = (t, have, step)
        store = links_.read_seconds(p.agent, nbytes) if self.world.checkpoint_readable else math.inf
        if best is not None and best[0] < store:
            return best[1], best[2]
        return None

    def load(self, p: model.Placed, after: list[int]) -> int | model.Blocked:
        parts = self._parts(p)
        if parts is not None:
            return self._load_parts(p, parts, after)
        src = self.source(p)
        if src is None and not self.world.checkpoint_readable:
            return model.Blocked(
                "NoSource",
                f"no agent holds the tensors of {p.block.describe()} and the checkpoint "
                "cannot be read from storage",
            )
        deps = list(after) + self.unloads_on.get((p.agent, p.block.device), [])
        peer = None
        if src is not None:
            have, loaded_by = src
            peer = actions.PeerSource(
                have.agent, have.address, have.block.replica_id, have.block.stage_index
            )
            if loaded_by is not None:
                deps.append(loaded_by)
        sid = self.add(actions.LoadBlock(p.agent, p.address, p.block, peer, p.data_plane), deps)
        if src is not None:
            self.readers.setdefault((src[0].agent, src[0].block.key), []).append(sid)
        self._took(p, sid)
        return sid

    def _load_parts(
        self, p: model.Placed, parts: tuple[actions.SwitchPart, ...], after: list[int]
    ) -> int:
        deps = list(after) + self.unloads_on.get((p.agent, p.block.device), [])
        sid = self.add(
            actions.LoadBlock(p.agent, p.address, p.block, None, p.data_plane, parts), deps
        )
        for part in parts:
            if part.source is not None and part.source.transport != replica_sources.HOST:
                key = (part.source.replica_id, part.source.stage_index, 0)
                self.readers.setdefault((part.source.agent, key), []).append(sid)
        self._took(p, sid)
        return sid

    def _took(self, p: model.Placed, sid: int) -> None:
        dev = (p.agent, p.block.device)
        # a load without a KV budget takes all the memory left on its device
        took = p.block.bytes if p.block.kv_bytes else max(self.free.get(dev, 0), p.block.bytes)
        self.free[dev] = self.free.get(dev, 0) - took
        self.present[(p.agent, p.block.key)] = (p, sid)
        self.ours_bytes += p.block.bytes
        self.peak_bytes = max(self.peak_bytes, self.ours_bytes)

    def cut_over(self, replicas: list[routes_doc.RouteReplica], after: list[int]) -> int:
        keep = {r.id for r in replicas}
        gone = tuple(r.id for r in self.routed if r.id not in keep)
        sid = self.add(
            actions.CutOver(
                self.target.generation, tuple(replicas), gone, self.world.drain.deadline_s
            ),
            after + self.route_steps,
        )
        self.routed = list(replicas)
        self.route_steps = [sid]
        return sid


def victim(sim: StepBuilder, need: Mapping[model.DevKey, int], target_ids: set[str]) -> str | None:
    """The routed old replica whose retirement frees most of the deficit, provided another
    complete replica keeps serving (or nothing was serving to begin with)."""
    short = sim.deficit(need)
    best: tuple[int, str] | None = None
    complete = [r.id for r in sim.routed if sim.complete(r.id)]
    for r in sim.routed:
        if r.id in target_ids or not sim.ours(r.id):
            continue
        if sim.world.published is not None and not [c for c in complete if c != r.id]:
            continue  # no other complete replica would serve
        freed = sum(
            min(p.block.bytes, short.get((p.agent, p.block.device), 0)) for p in sim.held(r.id)
        )
        if freed > 0 and (best is None or freed > best[0]):
            best = (freed, r.id)
    return best[1] if best is not None else None


def make_room(
    sim: StepBuilder,
    r: routes_doc.RouteReplica,
    todo: list[model.Placed],
    target_ids: set[str],
    loads: list[int],
    done_new: list[routes_doc.RouteReplica],
) -> model.Blocked | None:
    """Retire old replicas (cut-over, drain, unload) until `todo` fits; None when it does."""
    need: dict[model.DevKey, int] = {}
    for p in todo:
        k = (p.agent, p.block.device)
        need[k] = need.get(k, 0) + p.block.bytes
    while sim.deficit(need):
        chosen = victim(sim, need, target_ids)
        if chosen is None:
            dev, short = next(iter(sim.deficit(need).items()))
            return model.Blocked(
                "InsufficientMemory",
                f"replica {r.id} needs {need[dev]} bytes on {dev[0]}/{dev[1]}, which has "
                f"{sim.free.get(dev, 0)} free ({short} short) even after freeing every old "
                "replica that can go while another keeps serving",
            )
        keep = [x for x in sim.routed if x.id != chosen]
        keep += [x for x in done_new if x not in keep]
        cut = sim.cut_over(keep, loads)
        sim.retire(chosen, [cut])
        sim.retired += 1
    return None
