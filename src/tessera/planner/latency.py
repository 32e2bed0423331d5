"""Latency-aware objective: modelled P99 TTFT, TPOT and request latency of a layout at a
demand (req/s per class), where the throughput objective (`evaluate`) cannot see why a
long-prompt class wants high TP and short chats many small replicas.

Per replica (`replica`): utilization from the capacity model's rates, busy slots and the
decode round `R(n)`; a prompt stalls the decodes by its chunk's cost in a shared step
(`cost.latency.stage_chunk_seconds`, the simulator's step costs); `TPOT = R(n) / (1 - u)`;
TTFT adds Erlang-C and M/M/1 waits; the decode is spread by the prefills inside it
(`queueing.stretch`). P99s are quantiles of the demand-weighted mixture (`latency_report`).
Routing: `best_routing` (the capped LP of `routing_lp` at several caps, the makespan
routing, optionally replicas dedicated to one class) and `robust_routing` (the best worst
case over several mixes). Every figure is model output. Callers: `planner.table1`, the
switching loop, the simulator's switcher; docs/switching.md has the model in full.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tessera.cost import capacity, queueing
from tessera.cost import latency as stage_latency
from tessera.planner import assign, latency_report, routing_lp
from tessera.planner.capacity_table import CapacityTable, replica_layout
from tessera.planner.deployment import Deployment
from tessera.planner.latency_report import INFEASIBLE, LatencyReport, Q, Robust
from tessera.planner.problem import PlanningProblem
from tessera.planner.shapes import Shape

CAPS: tuple[float, ...] = (0.5, 0.65, 0.8, 0.9, 0.97)  # utilization caps tried by routing


@dataclass(frozen=True)
class _ShapeFacts:
    first_token: tuple[float, ...]  # [j] pipeline prefill latency
    occupancy: tuple[float, ...]  # [j] a prompt's stall on the decodes (slowest stage)
    batch: tuple[int, ...]  # [j] capacity model's batch
    rates: tuple[float, ...]  # [j] capacity (req/s)


class LatencyModel:
    """Prices layouts of one problem at a demand (module docstring)."""

    def __init__(self, problem: PlanningProblem, table: CapacityTable, scv: float = 1.0) -> None:
        self.problem = problem
        self.table = table
        self.scv = scv
        self._facts: dict[Shape, _ShapeFacts] = {}

    def facts(self, shape: Shape) -> _ShapeFacts:
        """Per-class prefill latency, occupancy, batch and capacity of ``shape``."""
        found = self._facts.get(shape)
        if found is None:
            info = self.table.infos[shape]
            lay = replica_layout(self.problem, shape, info.layer_ranges)
            first, occ = [], []
            for cls in self.problem.classes:
                pre = [
                    stage_latency.stage_prefill_seconds(
                        self.problem.profile, s, cls.input_tokens, lay.tp, lay.intra
                    )
                    for s in lay.stages
                ]
                first.append(sum(pre))
                # the stall a prompt puts on the decodes it shares a step with: its tokens
                # at the step's per-token cost, on the slowest stage (a pipelined round
                # is the slowest stage's work on every microbatch)
                occ.append(
                    max(
                        stage_latency.stage_chunk_seconds(
                            self.problem.profile, s, cls.input_tokens, lay.tp, lay.intra
                        )
                        for s in lay.stages
                    )
                )
            found = _ShapeFacts(
                tuple(first), tuple(occ), tuple(c.batch for c in info.capacities), info.rates
            )
            self._facts[shape] = found
        return found

    def replica(
        self, shape: Shape, x: tuple[float, ...]
    ) -> tuple[
        list[queueing.Component],
        list[queueing.Component],
        list[queueing.Component],
        list[tuple[float, float]],
    ]:
        """Latency, normalized latency and TTFT components, and (weight, TPOT) pairs, of
        one replica at rates x."""
        f = self.facts(shape)
        classes = self.problem.classes
        lam = sum(x)
        if lam <= 0:
            return [], [], [], []
        rho = sum(xj / f.rates[j] for j, xj in enumerate(x) if xj > 0)
        if rho >= 1 or any(xj > 0 and f.rates[j] <= 0 for j, xj in enumerate(x)):
            inf = [queueing.Component(lam, math.inf)]
            return inf, inf, inf, [(lam, math.inf)]
        load = [xj / f.rates[j] if xj > 0 else 0.0 for j, xj in enumerate(x)]
        slots = max(1, round(sum(w * f.batch[j] for j, w in enumerate(load)) / rho))
        busy = max(1.0, rho * slots)
        context = (
            sum(
                w * (classes[j].input_tokens + (classes[j].output_tokens - 1) / 2)
                for j, w in enumerate(load)
            )
            / rho
        )
        lay = replica_layout(self.problem, shape, self.table.infos[shape].layer_ranges)
        rnd = capacity.decode_round_seconds(
            self.problem.profile, lay, max(1, math.ceil(busy)), context
        )
        u = sum(xj * f.occupancy[j] for j, xj in enumerate(x))
        if u >= 1:
            inf = [queueing.Component(lam, math.inf)]
            return inf, inf, inf, [(lam, math.inf)]
        mean_occ = u / lam
        tpot = rnd / (1 - u)
        mu = lam / (rho * slots)
        slot = queueing.slot_wait(slots, lam, mu, self.scv)
        pre = queueing.single_wait(u, mean_occ, self.scv)
        # prefill seconds² arriving per second: how unevenly prefills stall the decodes
        interrupts = sum(xj * f.occupancy[j] ** 2 for j, xj in enumerate(x))
        total, norm, ttft, tpots = [], [], [], []
        for j, xj in enumerate(x):
            if xj <= 0:
                continue
            first = f.first_token[j] + rnd + mean_occ
            out = classes[j].output_tokens
            decode = (out - 1) * tpot
            shift, spread = queueing.stretch(interrupts, decode, u)
            ttft.append(queueing.Component(xj, first, slot, pre))
            total.append(queueing.Component(xj, first + decode + shift, slot, pre, spread))
            norm.append(
                queueing.Component(
                    xj,
                    (first + decode + shift) / out,
                    queueing.scaled(slot, 1 / out),
                    queueing.scaled(pre, 1 / out),
                    queueing.scaled(spread, 1 / out),
                )
            )
            tpots.append((xj, tpot))
        return total, norm, ttft, tpots

    def report(
        self, shapes: tuple[Shape, ...], counts: tuple[int, ...], rates: assign.Matrix
    ) -> LatencyReport:
        """P99s of groups of identical replicas, each group splitting its rates evenly."""
        total: list[queueing.Component] = []
        norm: list[queueing.Component] = []
        ttft: list[queueing.Component] = []
        tpots: list[tuple[float, float]] = []
        worst = 0.0
        for shape, n, row in zip(shapes, counts, rates, strict=True):
            if n <= 0:
                continue
            x = tuple(v / n for v in row)
            f = self.facts(shape)
            worst = max(worst, sum(v / f.rates[j] for j, v in enumerate(x) if v > 0))
            a, b, c, d = self.replica(shape, x)
            total += a
            norm += b
            ttft += c
            tpots += d
        if not total:
            return INFEASIBLE
        p99_tpot = latency_report.weighted_quantile(tpots, Q)
        p99_ttft = queueing.mixture_quantile(ttft, Q)
        slo = self.problem.slo
        return LatencyReport(
            p99_latency_s=queueing.mixture_quantile(total, Q),
            p99_normalized_s=queueing.mixture_quantile(norm, Q),
            p99_ttft_s=p99_ttft,
            p99_tpot_s=p99_tpot,
            max_utilization=worst,
            meets_slo=p99_ttft <= slo.ttft_s and p99_tpot <= slo.tpot_s,
            rates=tuple(tuple(r) for r in rates),
            groups=tuple(zip(shapes, counts, strict=True)),
        )

    def best_routing(
        self,
        shapes: tuple[Shape, ...],
        counts: tuple[int, ...],
        demand: tuple[float, ...],
        dedicate: bool = False,
    ) -> LatencyReport:
        """The best of the capped latency LPs and the makespan routing (module docstring).

        Replicas of one shape form a group that splits each class evenly. With
        ``dedicate``, every way of setting ``m`` replicas of one group apart for one class
        alone is tried too (a tp4 pair where one serves long prompts only)."""
        structures: list[tuple[tuple[Shape, ...], tuple[int, ...], tuple[int | None, ...]]] = [
            (shapes, counts, tuple(None for _ in shapes))
        ]
        if dedicate:
            for g, (shape, n) in enumerate(zip(shapes, counts, strict=True)):
                for j in range(len(demand)):
                    for m in range(1, n + 1):
                        if m == n and len(shapes) == 1:
                            continue  # the other classes would have no replica
                        rest: list[tuple[Shape, int, int | None]] = [
                            (s, n - m if k == g else c, None)
                            for k, (s, c) in enumerate(zip(shapes, counts, strict=True))
                        ]
                        kept = [p for p in rest if p[1] > 0] + [(shape, m, j)]
                        structures.append(
                            (
                                tuple(p[0] for p in kept),
                                tuple(p[1] for p in kept),
                                tuple(p[2] for p in kept),
                            )
                        )
        best = INFEASIBLE
        for group_shapes, group_counts, only in structures:
            report = self._route(group_shapes, group_counts, only, demand)
            if report.key() < best.key():
                note = ", ".join(
                    f"{n}x {s.label()}: {self.problem.classes[o].name} only"
                    for s, n, o in zip(group_shapes, group_counts, only, strict=True)
                    if o is not None
                )
                best = dataclasses.replace(report, dedicated=note)
        return best

    def robust_routing(
        self,
        shapes: tuple[Shape, ...],
        counts: tuple[int, ...],
        demands: Sequence[tuple[float, ...]],
        dedicate: bool = False,
    ) -> Robust:
        """The routing with the lowest worst case over ``demands`` (e.g. the forecast and
        the mix observed since), for a forecast that may be wrong.

        A gateway applies a routing as each class's split over the groups, whatever rate
        arrives; so each demand's best routing (`best_routing`), that of their mean and,
        with ``dedicate``, each demand's best with no replica set apart, is kept as that
        split and priced at every demand, and the split whose worst report is best wins (ties: the
        better at the first demand, then the earlier demand's). No feasible routing at
        any demand: ``split`` is empty."""
        if not demands:
            raise ValueError("no demand to route")
        unique = list(dict.fromkeys(tuple(float(v) for v in d) for d in demands))
        best: Robust | None = None
        pooled = tuple(float(v) for v in np.mean(np.asarray(unique), axis=0))
        tries = [(d, dedicate) for d in unique]
        if len(unique) > 1:
            tries += [(pooled, dedicate)] + ([(d, False) for d in unique] if dedicate else [])
        for d, apart in tries:
            planned = self.best_routing(shapes, counts, d, apart)
            if not planned.groups:
                continue
            split = self._split(planned)
            g_shapes = tuple(s for s, _ in planned.groups)
            g_counts = tuple(n for _, n in planned.groups)
            at = [
                dataclasses.replace(
                    self.report(g_shapes, g_counts, routing_lp.apply_split(split, x)),
                    dedicated=planned.dedicated,
                )
                for x in unique
            ]
            worst = max(at, key=LatencyReport.key)
            if best is None or (worst.key(), at[0].key()) < (best.worst.key(), best.at[0].key()):
                best = Robust(tuple(unique), tuple(at), worst, split)
        if best is None:
            return Robust(tuple(unique), tuple(INFEASIBLE for _ in unique), INFEASIBLE)
        return best

    def _split(self, planned: LatencyReport) -> tuple[tuple[float, ...], ...]:
        """[group][class] share of each class's rate; a class with no rate splits by the
        groups' capacity for it (what a capacity-weighted router does)."""
        rates = np.asarray(planned.rates, dtype=np.float64)
        caps = np.asarray(
            [[n * r for r in self.facts(s).rates] for s, n in planned.groups], dtype=np.float64
        )
        out = np.zeros_like(rates)
        for j in range(rates.shape[1]):
            col = rates[:, j] if rates[:, j].sum() > 0 else caps[:, j]
            if col.sum() > 0:
                out[:, j] = col / col.sum()
        return tuple(tuple(float(v) for v in row) for row in out)

    def _route(
        self,
        shapes: tuple[Shape, ...],
        counts: tuple[int, ...],
        only: tuple[int | None, ...],
        demand: tuple[float, ...],
    ) -> LatencyReport:
        capacity_matrix = tuple(
            tuple(n * r if o is None or o == j else 0.0 for j, r in enumerate(self.facts(s).rates))
            for s, n, o in zip(shapes, counts, only, strict=True)
        )
        try:
            balanced = assign.solve(assign.AssignmentProblem(demand, capacity_matrix), "makespan")
        except assign.InfeasibleError:
            return INFEASIBLE
        if balanced.value >= 1:
            return INFEASIBLE
        candidates: list[assign.Matrix] = [balanced.rates]
        cost = [[self._queue_free(s, j) for j in range(len(demand))] for s in shapes]
        for cap in CAPS:
            if cap <= balanced.value:
                continue
            routed = routing_lp.capped_lp(demand, capacity_matrix, cost, cap)
            if routed is not None:
                candidates.append(routed)
        reports = [self.report(shapes, counts, r) for r in candidates]
        return min(reports, key=LatencyReport.key)

    def deployment(self, planned: Deployment, demand: tuple[float, ...]) -> LatencyReport:
        """A planned deployment's modelled latency at ``demand`` (e.g. the next span's
        forecast), with its best routing; replicas of one shape form a group."""
        groups: dict[Shape, int] = {}
        for replica in planned.replicas:
            span = len({node for node, _ in replica.gpus})
            shape = Shape(replica.tp, replica.pp, span)
            groups[shape] = groups.get(shape, 0) + 1
        if any(s not in self.table.infos for s in groups):
            return INFEASIBLE
        ordered = sorted(groups, key=Shape.sort_key)
        return self.best_routing(tuple(ordered), tuple(groups[s] for s in ordered), demand)

    def _queue_free(self, shape: Shape, j: int) -> float:
        f = self.facts(shape)
        if f.rates[j] <= 0:
            return math.inf
        cap = self.table.infos[shape].capacities[j]
        return f.first_token[j] + (self.problem.classes[j].output_tokens - 1) * cap.tpot_s
