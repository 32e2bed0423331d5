"""CoCoServe's layer replication in the simulator: the replicated replica and its plan.

Setup (after CoCoServe Fig. 10): two Llama-2-13B replicas on one H100 each (tp1) and two
H100s another tenant leaves mostly idle (`IDLE` of their compute, `HELPER_FREE_BYTES`
free). `MODES`: `two_instances`; `layer_replication` (Algorithm 1,
`policies.module_scaling.scale_up` over `policies.speedup`, via `plan_replication`, and
Algorithm 2 on SLO violations, `sim.cocoserve_down`); `replication_up_only`;
`four_instances` (the helpers as whole replicas, the upper reference). `ReplicatedReplica`:
each running request pinned to a holder by `policies.request_split.assign`; at layer i it
runs on its holder if that holds layer i, else on the origin; a step is per layer the
slowest holder's share (weight read, GEMM, attention, KV reads over its available speed)
plus the helpers' hidden states out and back (`DELTA` = 2, Eq. 2). Helpers keep KV in the
memory the plan left (`_pooled_pages`). Callers: `sim.cocoserve_load`, `sim.cocoserve_down`.
Every figure is a simulation; docs/simulation.md, "CoCoServe".
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from tessera.cost.capacity import Slo
from tessera.cost.profile import Link, Profile
from tessera.policies.scaling import module_scaling, request_split
from tessera.policies.scaling import speedup as sp
from tessera.sim import arrivals
from tessera.sim.replica import SimReplica, SimRequest
from tessera.sim.steptime import StageCost, layer_and_head
from tessera.workload import traces

IDLE = 0.8  # share of a helper GPU's compute its own tenant leaves idle
HELPER_FREE_BYTES = 30 * 2**30
GPU_MEMORY = 80 * 2**30
DELTA = 2.0  # scatter and gather per replicated layer
PLAN_BATCH = 64  # the running batch Algorithm 1 sizes a replica's KV for
SLO = Slo(ttft_s=2.0, tpot_s=0.1)  # the planner bench's SLO; its TPOT is Algorithm 2's step budget
# two_instances: no replication; layer_replication: Algorithm 1 at the start, Algorithm 2
# on SLO violations (`sim.cocoserve_down`); replication_up_only: Algorithm 1 only;
# four_instances: the helpers as whole replicas
MODES = ("two_instances", "layer_replication", "replication_up_only", "four_instances")


class ReplicatedReplica(SimReplica):
    """A replica whose layers are replicated onto helper devices (module docstring)."""

    def __init__(
        self,
        base: SimReplica,
        profile: Profile,
        placed: sp.Placement,
        speeds: dict[str, float],
        link: Link,
        helper_kv_bytes: dict[str, int] | None = None,
    ) -> None:
        pages = base.alloc.num_pages
        if helper_kv_bytes:
            pages = _pooled_pages(base, placed, speeds, helper_kv_bytes)
        super().__init__(
            base.name,
            base.model,
            pages,
            base.page_size,
            base.page_bytes,
            base.limits,
            base.max_macro,
        )
        self.placed, self.speeds, self.link = placed, speeds, link
        self.layer, self.head = layer_and_head(profile, 1, link)
        self.act = profile.memory.activation_bytes_per_token
        self.home: dict[int, str] = {}  # layers migrated off the origin (Algorithm 2)
        self.runs: list[tuple[tuple[str, ...], int]] = []
        self.holders: tuple[str, ...] = ()
        self.split = request_split.Split((), {})
        self.rebuild(placed)
        self.observed = Observed()
        self._busy: dict[str, float] = {}  # per holder, of the step being booked
        self._critical: dict[str, float] = {}

    def rebuild(self, placed: sp.Placement) -> None:
        """Take a new placement (after Algorithm 1 or 2): layer runs by holders, the
        layer's home (origin, or where it was migrated) first."""
        self.placed = placed
        runs: dict[tuple[str, ...], int] = {}
        for i, holders in enumerate(placed.replicas):
            home = self.home.get(i, placed.origin)
            key = (home, *(h for h in holders if h != home))
            runs[key] = runs.get(key, 0) + 1
        self.runs = list(runs.items())  # (holders, layers)
        holders_ = tuple(dict.fromkeys(h for key, _ in self.runs for h in key))
        if holders_ != self.holders:
            self.holders = holders_
            self.split = request_split.Split(holders_, {})

    def complete(self, now: float) -> list[SimRequest]:
        """As `SimReplica.complete`, recording what the scale-down controller observes:
        steps, their seconds and batch, each holder's busy seconds, finished requests."""
        s = self.step
        assert s is not None
        o = self.observed
        o.steps += s.count
        o.step_s += s.dt * s.count
        o.batch += len(s.picks) * s.count
        for h, t in self._busy.items():
            o.busy[h] = o.busy.get(h, 0.0) + t * s.count
        for h, t in self._critical.items():
            o.critical[h] = o.critical.get(h, 0.0) + t * s.count
        out = super().complete(now)
        for r in out:
            if r.finish >= 0:
                o.finished.append(
                    (r.first - r.arrival, (r.finish - r.first) / max(1, r.output - 1))
                )
        return out

    def step_seconds(
        self,
        chosen: list[tuple[SimRequest, int]],
        decodes: int,
        ctx: int,
        chunks: list[tuple[int, int]],
        logits: int,
    ) -> float:
        ids = [str(r.rid) for r, _ in chosen]  # ordered: a set would follow the hash seed
        cur = self.split.assignment
        self.split = request_split.assign(
            self.holders,
            self.speeds,
            {r: h for r, h in cur.items() if r in self.by_id},
            joined=[i for i in ids if i not in cur],
            left=[r for r in cur if r not in self.by_id],
        )
        busy: dict[str, float] = {}
        critical: dict[str, float] = {}  # holder -> seconds it set the step's pace
        slowest = self.placed.origin
        work: dict[str, list[float]] = {h: [0.0, 0.0, 0.0] for h in self.holders}
        for req, n in chosen:
            w = work[self.split.assignment[str(req.rid)]]
            w[0] += n
            if req.generated and n == 1 and req.pending == 1:
                w[2] += req.computed + 1
            else:
                k = req.computed
                w[1] += (k + n) * (k + n) - k * k
        total = self.head.const + self.head.per_logit * logits
        origin = self.placed.origin
        for key, layers in self.runs:
            share = {h: [0.0, 0.0, 0.0] for h in key}
            for h, w in work.items():
                tgt = share[h] if h in share else share[key[0]]  # else the layer's home
                for i in range(3):
                    tgt[i] += w[i]
            worst = 0.0
            for h, (tok, pairs, ctx_h) in share.items():
                t = (_busy(self.layer, tok, pairs, ctx_h)) / self.speeds[h]
                if h != origin and tok:
                    t += DELTA * (
                        self.link.latency_s + tok * self.act / self.link.bandwidth_bytes_per_s
                    )
                busy[h] = busy.get(h, 0.0) + layers * t
                if t > worst:
                    worst, slowest = t, h
            total += layers * worst
            if worst > 0:
                critical[slowest] = critical.get(slowest, 0.0) + layers * worst
        self._busy, self._critical = busy, critical
        return total


@dataclass
class Observed:
    """What a replicated replica did since the scale-down controller last looked."""

    steps: int = 0
    step_s: float = 0.0  # sum of step seconds
    batch: int = 0  # sum of sequences per step
    busy: dict[str, float] = field(default_factory=dict)  # holder -> busy seconds
    # holder -> seconds of the steps' critical path it set (the slowest holder per layer)
    critical: dict[str, float] = field(default_factory=dict)
    finished: list[tuple[float, float]] = field(default_factory=list)  # (TTFT, TPOT)


def _pooled_pages(
    base: SimReplica, placed: sp.Placement, speeds: dict[str, float], helper: dict[str, int]
) -> int:
    """The pool of a replica whose helpers hold their requests' KV for the layers they
    replicate: with requests split by speed, a helper h holds a share f_h = (speed share) x
    (its layers / L) of every token's KV and the origin the rest, so the tokens that fit
    are min(origin pool / (1 - sum f_h), helper room_h / f_h) (an aggregate of the real
    per-device pools: one allocator, sized by the first to fill)."""
    total = sum(speeds.values())
    L = placed.num_layers
    frac = {h: speeds[h] / total * len(placed.on(h)) / L for h in helper}
    origin_frac = 1.0 - sum(frac.values())
    limits = [base.alloc.num_pages / max(origin_frac, 1e-9)]
    limits += [helper[h] / base.page_bytes / f for h, f in frac.items() if f > 0]
    return max(1, int(min(limits)))


def _busy(c: StageCost, tokens: float, pairs: float, ctx: float) -> float:
    if not tokens:
        return 0.0
    return c.const + c.per_token * tokens + c.per_pair * pairs + c.per_ctx * ctx


def plan_replication(
    profile: Profile, origin: str, helper: str, batch: int, context: int
) -> module_scaling.ScaleUpPlan:
    """Algorithm 1 for one replica with one mostly idle helper. Units of Eqs. 1-2 from
    the profile: capacity C = d^2 / (one token's per-layer GEMM seconds), so
    d^2 bs l / C is seconds; bandwidth B in hidden-state elements per second. The
    helper's capacity is its idle share; a replica's bytes are one layer's weights plus
    the KV of its speed share of `batch` sequences of `context` tokens."""
    link = profile.comm.intra_node
    d = profile.model.hidden_size
    per_token = max(profile.prefill.per_token, profile.decode.per_seq)
    cap = d * d / per_token
    elems = link.bandwidth_bytes_per_s / (profile.memory.activation_bytes_per_token / d)
    devices = {
        origin: sp.Device(origin, cap, float("inf"), 0, 0.0),
        helper: sp.Device(helper, IDLE * cap, elems, HELPER_FREE_BYTES, IDLE),
    }
    wl = sp.Workload(d, batch, context, DELTA)
    share = IDLE / (1.0 + IDLE)
    kv = int(profile.memory.kv_bytes_per_token * context * batch * share)
    return module_scaling.scale_up(
        sp.Placement.initial(origin, profile.model.num_layers),
        devices,
        wl,
        profile.memory.layer_param_bytes + kv,
        module_scaling.ScalingConfig(enabled=True),
    )


def sampled(
    rate: float, duration: float, pool: Sequence[traces.Request], seed: int
) -> list[arrivals.Arrival]:
    """Poisson arrivals whose lengths are drawn from trace requests."""
    rng = random.Random(seed)
    out, t = [], rng.expovariate(rate)
    while t < duration:
        r = pool[rng.randrange(len(pool))]
        out.append(arrivals.Arrival(t, max(1, r.input_tokens), max(1, r.output_tokens)))
        t += rng.expovariate(rate)
    return out
