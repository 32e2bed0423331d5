"""The operator's switching loop as a controller of the simulated cluster (`Switcher`).

Every span it counts each class's arrivals and calls the operator's own span step
(`policies.switching_step.step`: forecast, cheapest candidate from the planner's latency
objective, `policies.switching.decide`); a switch is applied after the switch plan's time
(or the transition plan's modelled steps) plus the running requests' KV hand-over. With a
calibration (`cost.calibration`) it prices layouts with the corrected model and takes the
hysteresis from its error. Used by `sim.oserve_table2` (Table 2's runs) and the sim
tests; every figure it produces is a simulation.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.cost import calibration as calibration_
from tessera.cost.capacity import RequestClass, Slo
from tessera.cost.profile import Profile
from tessera.planner import table1
from tessera.planner.latency import LatencyModel
from tessera.planner.latency_report import LatencyReport, Robust
from tessera.planner.layout import Layout
from tessera.planner.shapes import Shape
from tessera.policies import device_links, links, placement
from tessera.policies.routing import reroute
from tessera.policies.routing.shares import centroid_class_router
from tessera.policies.switching import gain as switching
from tessera.policies.switching import step as switching_step
from tessera.policies.switching import switch_plan
from tessera.sim import engine, oserve_calibrate, relayout
from tessera.sim.oserve import (
    GPUS,
    NODES,
    Built,
    build,
)
from tessera.sim.replica import SimReplica, adopt

# the gateway's counters read this many times per span (every 5 s of a 60 s span); a read
# moves the split only when its counts reject the span's planned mixes
# (`policies.routing.reroute.decide`, at 1 % per span over these reads)
REROUTES = 12


@dataclass
class Switcher:
    """The operator's switching loop, run every span on the simulated cluster: count
    each class's arrivals and call the operator's own span step
    (`policies.switching_step.step`: forecast, cheapest candidate, `switching.decide`).
    What the simulator supplies is what the operator's candidate source supplies: the
    candidate (the planner's latency objective, `table1.choose`, at the step's forecast),
    the price (each layout's modelled P99 with its best routing, class-dedicated
    replicas allowed) and the switch time (`policies.switch_plan.plan`). Every layout is
    routed and priced by its worst over the forecast and the last span as observed
    (`LatencyModel.robust_routing`); on a stay the current layout is re-routed so, and
    again within the span from the counts so far (`_reroute`)."""

    profile: Profile
    base: tuple[RequestClass, ...]
    slo: Slo
    current: Built
    current_layout: Layout
    cfg: switching.SwitchingConfig
    storage_bytes_per_s: float = table1.STORAGE_BYTES_PER_S
    nodes: int = NODES
    gpus: int = GPUS
    use_transition: bool = True  # apply switches through the transition planner
    shared_cache: dict[tuple[int | float, ...], table1.Choice] | None = None  # across runs
    # the latency model calibrated against simulated runs (`sim.oserve_calibrate`):
    # corrected prices, and the hysteresis from its error; None: the raw model, minGain
    calibration: calibration_.Calibration | None = None
    executor: relayout.Executor | None = None  # the transition in progress
    transitions: list[dict[str, Any]] = field(default_factory=list)
    state: switching.HysteresisState = field(default_factory=switching.HysteresisState)
    counts: list[list[float]] | None = None
    decisions: list[dict[str, Any]] | None = None
    _seen: int = 0
    _gen: int = 0
    _next: float = 0.0
    _cache: dict[tuple[int | float, ...], table1.Choice] | None = None
    _rates: dict[int, float] = field(default_factory=dict)
    # the span's pick, forecast, and the mixes its routing was planned for
    _planned: tuple[table1.Choice, tuple[float, ...], tuple[tuple[float, ...], ...]] | None = None
    _reroute_at: float = 0.0

    def __post_init__(self) -> None:
        self.counts, self.decisions = [], []
        self._cache = self.shared_cache if self.shared_cache is not None else {}
        self._next = self.cfg.span_s

    def tick(self, now: float, eng: engine.Engine) -> None:
        if now + 1e-9 < self._next:
            self._reroute(now, eng)
            return
        self._next += self.cfg.span_s
        self._planned = None
        assert self.counts is not None and self.decisions is not None
        self.counts.append(self._count(eng, now))
        if self.executor is not None and self.executor.finished_at is None:
            self.decisions.append(
                {"time_s": round(now, 1), "action": "busy", "reason": "a transition is running"}
            )
            return
        # The candidate source: the planner's latency objective at the step's forecast
        # (`table1.choose`). The step recomputes the same forecast from the same counts.
        demand = tuple(c / self.cfg.span_s for c in switching_step.forecast(self.counts).counts)
        current_name = self.current_layout.label()
        pick = self._choice(demand) if sum(demand) > 0 else None
        # the planner's heterogeneous choice; with a calibrated model also its best
        # homogeneous layout (the calibrated prices may rank them otherwise)
        options: dict[str, tuple[Layout, LatencyReport]] = {}
        if pick is not None:
            for which in (pick.hetero, pick.homo) if self.calibration else (pick.hetero,):
                if which[1].groups:
                    options.setdefault(which[0].label(), which)
            if not options:
                self.decisions.append(
                    {"time_s": round(now, 1), "action": "stay", "reason": "no layout serves it"}
                )
                return
        # every layout routed and priced for the worst of the forecast and the last span
        # as observed (`switching_step.plausible`: the step's own price range)
        seen = switching_step.plausible(demand, self.counts, self.cfg.span_s)
        model = LatencyModel(pick.problem, pick.table) if pick is not None else None
        robust: dict[str, Robust] = {}

        def routed(name: str) -> Robust:
            assert model is not None
            if name not in robust:
                lay = self.current_layout if name == current_name else options[name][0]
                robust[name] = model.robust_routing(*_groups(lay), seen, dedicate=True)
            return robust[name]

        here = routed(current_name).worst if pick is not None else None
        built: dict[str, Built] = {}

        def target_of(name: str) -> Built:
            assert pick is not None
            if name not in built:
                r = routed(name)
                which = (options[name][0], dataclasses.replace(r.worst, rates=r.rates()))
                built[name] = build(pick, which, f"g{self._gen + 1}-")
            return built[name]

        def price(name: str, at: tuple[float, ...]) -> float:
            assert pick is not None
            raw = max(routed(name).at_demand(at).p99_latency_s, 1e-9)
            if self.calibration is None:
                return raw
            load = sum(at) / self._sustainable(pick)
            return self.calibration.price(name, raw, oserve_calibrate.point(at, load))

        def switch_seconds(source: str, dest: str) -> float:
            assert source == current_name
            return self._switch_seconds(target_of(dest))

        step = switching_step.step(
            self.cfg,
            self.state,
            self.counts,
            current_name,
            list(options) or [current_name],
            price,
            switch_seconds,
            model_error=self.calibration.error if self.calibration else None,
        )
        decision = step.decision
        self.state = decision.state
        self.decisions.append(
            {"time_s": round(now, 1), **decision.to_json(), "current": current_name}
        )
        if pick is None or here is None:
            return
        self._planned = (pick, demand, seen)
        self._reroute_at = now + self.cfg.span_s / REROUTES
        if decision.action == switching.SWITCH:
            target, layout = target_of(decision.candidate), options[decision.candidate][0]
            self._gen += 1
            eng.result.actions.append((now, f"switch planned: {current_name} -> {target.label}"))
            if self.use_transition:
                self._transition(eng, target, layout)
            else:
                eng.at(
                    now + decision.switch_s,
                    f"switch: {current_name} -> {target.label}",
                    functools.partial(self._apply, eng, target, layout),
                )
        elif routed(current_name).split:
            # stay: the current layout re-routed (assignment per span)
            self._route(eng, routed(current_name))

    def _route(self, eng: engine.Engine, r: Robust) -> None:
        self.current.shares = _shares_of(self.current, r.worst.groups, r.rates())
        eng.router.set_class_shares(self.current.shares, _classifier(self.base))

    def _reroute(self, now: float, eng: engine.Engine) -> None:
        """Within a span, as a gateway reading its span counters so far: every
        `REROUTES`-th of a span, the current layout re-routed for the worst of the span's
        forecast and the mix arrived since the span began (a forecast lags a change of
        mix by a span; a routing planned for the old mix overloads a replica set apart
        for one class). Only when the counts reject every mix the span's routing was planned
        for (`policies.routing.reroute.decide`: a chi-square test); not while a transition
        runs (its executor routes)."""
        if self._planned is None or now + 1e-9 < self._reroute_at:
            return
        self._reroute_at += self.cfg.span_s / REROUTES
        if self.executor is not None and self.executor.finished_at is None:
            return
        began = self._next - self.cfg.span_s
        if now - began <= 0:
            return
        counts = self._count(eng, now, now - began)
        observed = tuple(c / (now - began) for c in counts)
        pick, demand, planned = self._planned
        if sum(observed) <= 0 or not reroute.decide(planned, counts, reads=REROUTES).reroute:
            return
        # the split is now planned for the mix counted so far too
        self._planned = (pick, demand, (*planned, observed))
        r = LatencyModel(pick.problem, pick.table).robust_routing(
            *_groups(self.current_layout), (demand, observed), dedicate=True
        )
        if r.split:
            self._route(eng, r)

    def _switch_seconds(self, target: Built) -> float:
        """The greedy switch plan's time from the current placement to `target`'s."""
        model = placement.model_bytes(self.profile)
        dev_links = device_links.from_comm(self.profile.comm, self.storage_bytes_per_s)
        return switch_plan.plan(self.current.placed, target.placed, model, dev_links).seconds

    def _choice(self, demand: tuple[float, ...]) -> table1.Choice:
        total = sum(demand)
        # the planner prices ~100 layouts per call (seconds): forecasts within 0.05 of a
        # share and 1 req/s of the rate reuse the candidate planned for the first of them
        key = (*(round(d / total * 20) for d in demand), round(total))
        assert self._cache is not None
        if key not in self._cache:
            shares = tuple(d / total for d in demand)
            problem, table = table1.mix_problem(
                self.profile, table1.mixed(self.base, shares), self.slo, self.nodes, self.gpus, True
            )
            self._cache[key] = table1.choose(problem, table, demand)
        return self._cache[key]

    def _sustainable(self, pick: table1.Choice) -> float:
        """The forecast mix's sustainable rate (where the demand sits for calibration)."""
        key = id(pick)
        if key not in self._rates:
            self._rates[key] = table1.sustainable_rps(pick.problem, pick.table)
        return self._rates[key]

    def _count(self, eng: engine.Engine, now: float, seconds: float | None = None) -> list[float]:
        """Arrivals per class in the last `seconds` (default: the span that just ended;
        the gateway's counters)."""
        arr = eng.arrivals_between(now - (seconds or self.cfg.span_s), now)
        classify = _classifier(self.base)
        names = [c.name for c in self.base]
        out = [0.0] * len(names)
        for a in arr:
            out[names.index(classify(a.prompt, a.output) or names[0])] += 1
        return out

    def _transition(self, eng: engine.Engine, target: Built, layout: Layout) -> None:
        """Hand the switch to the transition planner and its executor (`sim.relayout`)."""
        gen_old, gen_new = self._gen - 1, self._gen
        old = _layout(self.profile, gen_old, self.current, eng)
        new = _layout(self.profile, gen_new, target, None)
        node_names = sorted(
            {
                d[0]
                for p in (*self.current.placed, *target.placed)
                for s in p.stages
                for d in s.devices
            }
        )
        comm = self.profile.comm
        link_model = links.LinkModel(
            storage_bytes_per_s=self.storage_bytes_per_s,
            network_bytes_per_s=comm.inter_node.bandwidth_bytes_per_s,
            local_bytes_per_s=comm.intra_node.bandwidth_bytes_per_s,
            latency_s=comm.inter_node.latency_s,
        )
        began = eng.now
        record: dict[str, Any] = {"time_s": round(began, 1), "to": target.label}

        def done(ok: bool) -> None:
            ex = self.executor
            assert ex is not None and ex.plan is not None
            record.update(
                mode=ex.plan.mode,
                steps=len(ex.plan.steps),
                blocked=ex.plan.blocked.reason if ex.plan.blocked else "",
                seconds=round(eng.now - began, 3),
                cut_at_deadline=ex.cut_at_deadline,
            )
            if ok:
                self.current, self.current_layout = target, layout
                eng.result.actions.append((eng.now, f"switch: {record['to']} ({ex.plan.mode})"))
            else:
                self._gen -= 1
            ex.finished_at = eng.now

        self.transitions.append(record)
        self.executor = relayout.Executor(
            old,
            new,
            relayout.node_memory(self.gpus, node_names, table1.GPU_MEMORY),
            link_model,
            _classifier(self.base),
            done,
            model=placement.model_bytes(self.profile),
        )
        self.executor.start(eng)

    def _apply(self, eng: engine.Engine, target: Built, layout: Layout) -> None:
        """The switch landed: new replicas serve, old ones hand over what they hold."""
        olds = [eng.remove_replica(r.name) for r in self.current.replicas if r.name in eng.replicas]
        reqs = []
        for o in olds:
            o.settle(eng.now)
            reqs += o.running + list(o.waiting)
        for rep in target.replicas:
            eng.add_replica(rep)
        eng.router.set_class_shares(target.shares, _classifier(self.base))
        by_name = {r.name: r for r in target.replicas}
        moved: dict[str, list[Any]] = {}
        for q in reqs:
            route = eng.router.choose(sorted(by_name), q.prompt, q.output)
            assert route is not None
            moved.setdefault(route.replica_id, []).append(q)
        kv = self.profile.memory.kv_bytes_per_token * self.profile.model.num_layers
        link = self.profile.comm.inter_node
        for name, qs in moved.items():
            rep = by_name[name]
            adopt(rep, qs)
            for q in qs:
                eng.requeue(q, rep)
            rep.available_at = eng.now + link.transfer_seconds(
                kv * sum(q.computed for q in qs if q.is_running)
            )
        eng.refresh_ready()
        for rep in target.replicas:
            eng.at(rep.available_at, f"ready: {rep.name}", functools.partial(_ready, eng, rep))
        self.current, self.current_layout = target, layout


def _layout(profile: Profile, gen: int, built: Built, eng: engine.Engine | None) -> relayout.Layout:
    """A built layout as the transition planner's blocks (replicas still in `eng` only)."""
    by_name = {built.prefix + p.name: p for p in built.placed}
    reps = [r for r in built.replicas if eng is None or r.name in eng.replicas]
    return relayout.layout_of(profile, gen, reps, [by_name[r.name] for r in reps], built.shares)


def _ready(eng: engine.Engine, rep: SimReplica) -> None:
    eng.refresh_ready()
    eng.kick(rep)


def _groups(layout: Layout) -> tuple[tuple[Shape, ...], tuple[int, ...]]:
    pairs = [(s, n) for s, n in layout.shape_counts() if n > 0]
    return tuple(s for s, _ in pairs), tuple(n for _, n in pairs)


def _shares_of(
    built: Built, groups: Sequence[tuple[Shape, int]], rates: Sequence[Sequence[float]]
) -> dict[str, dict[str, float]]:
    """Shares of a re-routed layout: each group's rates over that many built replicas of
    its shape, split evenly (a class set apart takes the next replicas of its shape)."""
    names = list(built.shares)
    free: dict[Shape, list[str]] = {}
    for r in built.replicas:
        free.setdefault(built.shape_of[r.name], []).append(r.name)
    out: dict[str, dict[str, float]] = {n: {} for n in names}
    for (shape, n), row in zip(groups, rates, strict=True):
        members, free[shape] = free[shape][:n], free[shape][n:]
        for name in members:
            for j, cls in enumerate(names):
                if row[j] > 0:
                    out[cls][name] = row[j] / n
    return out


@functools.lru_cache(maxsize=8)
def _classifier_cached(key: tuple[tuple[str, float, float], ...]) -> Any:
    return centroid_class_router({n: (i, o) for n, i, o in key})


def _classifier(classes: Sequence[RequestClass]) -> Any:
    return _classifier_cached(
        tuple((c.name, float(c.input_tokens), float(c.output_tokens)) for c in classes)
    )
