"""One level-triggered pass: validate, observe, plan, diff and apply — shared by every shell.

`converge()` is what the operator's handlers and timer call and what `tessera up` runs:
1. semantic checks of the spec against the model's config.json and the known agents;
2. observe the agents (`Describe`);
3. plan (`tessera.plan.make_plan`);
4. diff against the observed blocks (`tessera.reconcile.reconcile`);
5. apply the actions (`actuate.apply`) and observe again.
It returns everything the caller needs to write status, conditions and events; it never
raises for a bad spec or an unreachable agent — those become a `reason`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tessera import api, fields, observed, plan, reconcile
from tessera.cost import model_shape
from tessera.planner import auto as planner_auto
from tessera_operator import actuate, agents

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class Outcome:
    """What one pass saw and did. `reason` is a condition reason, "Serving" when done."""

    reason: str
    message: str
    plan: plan.Plan | None = None
    actions: list[reconcile.Action] = field(default_factory=list)
    results: list[actuate.Result] = field(default_factory=list)
    observed: observed.Observed | None = None
    errors: list[fields.FieldError] = field(default_factory=list)
    ready_replicas: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[actuate.Result]:
        return [r for r in self.results if not r.ok]


def model_facts(model_path: str, dtype: str) -> model_shape.ModelShape | None:
    """The model's shape from its config.json, or None when it is not readable."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
        shape = model_shape.from_hf_config(cfg, Path(model_path).name)
    except (OSError, ValueError):
        return None
    return dataclasses.replace(shape, dtype_bytes=DTYPE_BYTES[dtype])


def resolve_model_path(
    spec: api.DeploymentSpec, base_dir: Path | None, model_root: str = ""
) -> str:
    """Where the checkpoint is: `path` (relative to the manifest's folder, or under
    `model_root` for a PVC mounted there)."""
    m = spec.model
    if m.pvc:
        return str(Path(model_root or "/models") / (m.sub_path or m.path))
    p = Path(m.path)
    if not p.is_absolute() and base_dir is not None:
        p = base_dir / p
    return str(p)


def ready_replicas(p: plan.Plan, obs: observed.Observed) -> list[str]:
    """Replicas whose every stage is loaded as planned on a reachable agent."""
    want = reconcile.desired_blocks(p, obs)
    have = {
        (a.name, b.replica_id, b.stage_index) for a in obs.agents if a.reachable for b in a.blocks
    }
    ready = []
    for r in p.replicas:
        if all(
            (w.agent, w.replica_id, w.stage_index) in have
            for w in want
            if w.replica_id == r.replica_id
        ):
            ready.append(r.replica_id)
    return ready


async def converge(
    dep: api.ServingDeployment,
    model_path: str,
    refs: Sequence[agents.AgentRef],
    progress: actuate.Progress | None = None,
    auto_planner: plan.AutoPlanner | None = None,
    apply: bool = True,
    on_actions: Callable[[list[reconcile.Action]], None] | None = None,
) -> Outcome:
    shape = model_facts(model_path, dep.spec.model.dtype)
    facts = (
        api.ModelFacts(shape.num_layers, shape.num_heads, shape.num_kv_heads)
        if shape is not None
        else None
    )
    errs = api.check_semantics(dep.spec, facts, [r.name for r in refs])
    if errs:
        if facts is None:
            errs[0] = fields.FieldError(
                "spec.model.path", f"model not readable: no config.json in {model_path}"
            )
        return Outcome("InvalidSpec", "; ".join(str(e) for e in errs), errors=errs)
    assert shape is not None
    obs = await agents.observe(refs)
    auto = auto_planner or planner_auto.default_auto_planner()
    try:
        desired = plan.make_plan(dep, shape, obs, model_path, auto)
    except plan.PlanError as exc:
        return Outcome(exc.reason, exc.message, observed=obs)
    actions = reconcile.reconcile(desired, obs, plan.owner_prefix(dep))
    out = Outcome("Serving", "", plan=desired, actions=actions, observed=obs)
    if on_actions is not None:
        on_actions(actions)  # e.g. size a progress bar before anything is applied
    if apply and actions:
        out.results = await actuate.apply(actions, progress)
        obs = await agents.observe(refs)
        out.observed = obs
    out.ready_replicas = ready_replicas(desired, obs)
    down = [a for a in obs.agents if not a.reachable]
    if out.failed:
        f = out.failed[0]
        reason = (
            "InsufficientCapacity"
            if f.code == "RESOURCE_EXHAUSTED"
            else (
                "AgentUnreachable"
                if f.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
                else "LoadFailed"
            )
        )
        out.reason, out.message = reason, f"{f.action.describe()}: {f.code}: {f.message}"
    elif down:
        out.reason = "AgentUnreachable"
        out.message = "; ".join(f"agent {a.name} ({a.address}): {a.error}" for a in down)
    elif len(out.ready_replicas) < len(desired.replicas):
        out.reason, out.message = (
            "Loading",
            (f"{len(out.ready_replicas)}/{len(desired.replicas)} replicas loaded"),
        )
    else:
        out.message = f"{len(desired.replicas)} replicas serving ({desired.source})"
    return out
