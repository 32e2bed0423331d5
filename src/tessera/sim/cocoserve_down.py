"""CoCoServe's scale down in the simulator: Algorithm 2 (`policies.module_scaling.scale_down`:
migrate, evict, reduce batch) run on SLO violations of `cocoserve.ReplicatedReplica`s.

Input: the replicas' observations since the last look (`cocoserve.Observed`), the SLO (its
TPOT is the step budget) and the devices. Output: the replicas changed in place and a
record per decision. Called by `cocoserve_load.load_rows` as an engine controller. Every
`period_s` per replica the violation rate is the share of requests finished over the TTFT
or TPOT target; the source is the holder that set most of the steps' time; its modules are
the layers it is home to (bytes: weights plus KV in use) and, on a helper, the replicas it
hosts. `scale_down` decides, the simulator applies: `Migrate` moves the layer's home,
`Evict` calls `Placement.remove`, `ReduceBatch` lowers `max_num_seqs`. Simplifications:
the KV pool keeps its size after a move, and Algorithm 1 is not re-run after a scale down.
Results: docs/simulation.md, "CoCoServe".
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tessera.cost.capacity import Slo
from tessera.cost.profile import Profile
from tessera.policies.scaling import module_scaling
from tessera.policies.scaling import speedup as sp
from tessera.sim import engine
from tessera.sim.cocoserve import DELTA, IDLE, Observed, ReplicatedReplica


@dataclass
class ScaleDown:
    """The scale-down loop (module docstring); an `engine.Controller`."""

    profile: Profile
    slo: Slo
    helper_free_bytes: dict[str, int]  # helper -> bytes not taken by weights or KV room
    context: int  # Eq. 2's sequence length (prices an eviction's lost speedup)
    period_s: float = 10.0
    cfg: module_scaling.ScalingConfig = field(
        default_factory=lambda: module_scaling.ScalingConfig(enabled=True)
    )
    records: list[dict[str, Any]] = field(default_factory=list)
    _next: float = 0.0

    def __post_init__(self) -> None:
        self._next = self.period_s

    def tick(self, now: float, eng: engine.Engine) -> None:
        if now + 1e-9 < self._next:
            return
        self._next += self.period_s
        for rep in list(eng.replicas.values()):
            if isinstance(rep, ReplicatedReplica):
                self._one(now, eng, rep)

    def _one(self, now: float, eng: engine.Engine, rep: ReplicatedReplica) -> None:
        o, rep.observed = rep.observed, Observed()
        if not o.finished or not o.steps:
            return
        over = sum(
            1 for ttft, tpot in o.finished if ttft > self.slo.ttft_s or tpot > self.slo.tpot_s
        )
        inp, devices = self.input_for(rep, o, over / len(o.finished))
        plan = module_scaling.scale_down(inp, devices, self.cfg)
        for a in plan.actions:
            apply(rep, a)
            eng.result.actions.append((now, f"scale down {rep.name}: {a}"))
        self.records.append(
            {
                "time_s": round(now, 1),
                "replica": rep.name,
                "source": inp.source,
                "violation_rate": round(inp.violation_rate, 3),
                "phase": plan.phase,
                "resolved": plan.resolved,
                "actions": [type(a).__name__ for a in plan.actions],
                "reason": plan.reason,
            }
        )

    def input_for(
        self, rep: ReplicatedReplica, o: Observed, violation_rate: float
    ) -> tuple[module_scaling.ScaleDownInput, dict[str, sp.Device]]:
        """Algorithm 2's input for one replica from what it did (module docstring)."""
        prof = self.profile
        crit = o.critical
        source = max(crit, key=lambda h: (crit[h], h)) if crit else rep.placed.origin
        per_step = {h: t / o.steps for h, t in o.busy.items()}
        placed = rep.placed
        L = placed.num_layers
        homes = [i for i in range(L) if rep.home.get(i, placed.origin) == source]
        hosted_layers = placed.on(source)
        n_src = max(1, len(homes) + len(hosted_layers))
        each = per_step.get(source, 0.0) / n_src
        kv_layer = rep.kv_used_bytes() // max(1, L)
        modules = tuple(
            module_scaling.Module(f"layer.{i}", prof.memory.layer_param_bytes + kv_layer, each)
            for i in homes
        )
        batch = max(1, round(o.batch / o.steps))
        wl = sp.Workload(prof.model.hidden_size, batch, self.context, DELTA)
        hosted = tuple(module_scaling.Hosted(rep.name, i, each) for i in hosted_layers)
        fixed = rep.head.const + L * rep.layer.const
        inp = module_scaling.ScaleDownInput(
            source=source,
            violation_rate=violation_rate,
            step_seconds=o.step_s / o.steps,
            step_budget_s=self.slo.tpot_s,
            modules=modules,
            hosted=hosted,
            owners={rep.name: (placed, wl)},
            batch_size=batch,
            fixed_seconds=min(fixed, o.step_s / o.steps),
        )
        return inp, self.devices(rep, o)

    def devices(self, rep: ReplicatedReplica, o: Observed) -> dict[str, sp.Device]:
        """The replica's holders as Eq. 1-2 devices: capacity d^2 / (a token's per-layer
        GEMM seconds) x speed, the helper's link in hidden-state elements per second, free
        bytes, and idle share (a helper's `IDLE` less what its replicas kept busy)."""
        prof = self.profile
        d = prof.model.hidden_size
        cap = d * d / max(prof.prefill.per_token, prof.decode.per_seq)
        elems = rep.link.bandwidth_bytes_per_s / (prof.memory.activation_bytes_per_token / d)
        span = max(o.step_s, 1e-9)
        out = {}
        for h in rep.holders:
            if h == rep.placed.origin:
                out[h] = sp.Device(h, cap, float("inf"), 0, 0.0)
            else:
                used = IDLE * min(1.0, o.busy.get(h, 0.0) / span)
                free = self.helper_free_bytes.get(h, 0)
                out[h] = sp.Device(h, rep.speeds[h] * cap, elems, free, max(0.0, IDLE - used))
        return out


def apply(rep: ReplicatedReplica, action: module_scaling.Action) -> None:
    """Apply one of Algorithm 2's actions to a replicated replica (module docstring)."""
    if isinstance(action, module_scaling.Migrate):
        layer = int(action.module.split(".")[1])
        rep.home[layer] = action.target
        placed = rep.placed
        if action.target in placed.replicas[layer]:
            placed = placed.remove(layer, action.target)
        rep.rebuild(placed)
    elif isinstance(action, module_scaling.Evict):
        rep.rebuild(rep.placed.remove(action.layer, action.device))
    elif isinstance(action, module_scaling.ReduceBatch):
        rep.limits = replace(rep.limits, max_num_seqs=action.after)
        rep.version += 1  # the policy's cached answer used the old limit
    rep.version += 1
