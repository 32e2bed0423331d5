"""One level-triggered pass: validate, observe, plan, transition and apply — shared by every shell.

`converge()` is what the operator's handlers and timer call and what `tessera up` runs:
1. semantic checks of the spec against the model's config.json and the known agents;
2. observe the agents (`Describe`, through the pass's shared `observation.Observation`);
3. plan (`tessera.plan.make_plan`), the generation floored at the routes version published;
4. plan the transition from what the agents hold and the routes published
   (`tessera.policies.transition.planner.plan`);
5. execute the steps that can be done now (`actuate.execute`; a cut-over calls the
   shell's `publish`), the variants' part (`converge_variants`), observe and re-plan.
It returns an `outcome.Outcome` for the caller to write status, conditions and events; it
never raises for a bad spec or an unreachable agent — those become a `reason`. Nothing of
a transition is remembered between passes: the next pass re-plans from observation.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tessera import (
    api,
    api_semantics,
    fields,
    model_facts,
    observed,
    plan,
    reconcile,
    routes_doc,
)
from tessera.control import (
    actuate,
    agents,
    converge_variants,
    link_probe,
    observation,
    outcome,
    speculate_ops,
    stitch_ops,
    variant_place,
)
from tessera.control import variants as variant_ops
from tessera.cost import model_shape
from tessera.observability import control
from tessera.planner import auto as planner_auto
from tessera.policies import links, pass_reason, placement
from tessera.policies.overload import desired as overload_desired
from tessera.policies.transition import actions as step_actions
from tessera.policies.transition import planner as transition
from tessera.policies.variants import plan as variant_plan
from tessera.rpc import transport


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
    have = {(a.name, b.key) for a in obs.agents if a.reachable for b in a.blocks}
    want = reconcile.desired_blocks(p, obs)
    return [
        r.replica_id
        for r in p.replicas
        if all((w.agent, w.block.key) in have for w in want if w.block.replica_id == r.replica_id)
    ]


def serving(obs: observed.Observed, prefix: str, routes: routes_doc.RoutesDoc | None) -> list[str]:
    """Routed replicas with every stage held: a complete generation serves."""
    if routes is None:
        return []
    done = transition.complete_replicas(obs, prefix)
    return [r for r in routes.replica_ids if r in done]


def filled(
    dep: api.ServingDeployment, p: plan.Plan | None, model_path: str, doc: routes_doc.RoutesDoc
) -> routes_doc.RoutesDoc:
    """The replica set, version, drain deadline and cut-over time of `doc` (what the
    transition published), with the model, the workload classes and the plan's class
    shares of the routed replicas. The gateway checks readiness itself."""
    routed = set(doc.replica_ids)
    shares = {
        c: {r: v for r, v in per.items() if r in routed}
        for c, per in (p.class_shares if p is not None else {}).items()
    }
    return dataclasses.replace(
        doc,
        model=dep.spec.model.name,
        model_path=model_path,
        class_shares={c: per for c, per in shares.items() if per},
        classes=tuple(
            routes_doc.ClassCentroid(c.name, c.input_tokens, c.output_tokens)
            for c in dep.spec.workload
        ),
    )


def switch_model(shape: model_shape.ModelShape) -> placement.ModelBytes:
    """Parameter bytes per unit for the switch plan's source choice."""
    b = shape.dtype_bytes
    return placement.ModelBytes(
        shape.num_layers,
        float(shape.layer_params * b),
        float(shape.embedding_params * b),
        float(shape.lm_head_params * b),
    )


@dataclass(frozen=True)
class Rollout:
    """How transitions run: the drain policy (`drain.deadline_s` is the deadline every
    routes document publishes; `drain_deadline_s`, when set, overrides it), link model,
    the clock."""

    drain_deadline_s: float | None = None
    drain: transition.DrainPolicy = field(default_factory=transition.DrainPolicy)
    links: links.LinkModel = field(default_factory=links.LinkModel)
    clock: Callable[[], float] = time.time
    # where loads copy from (`transition_model.SOURCINGS`): "switch" the OServe switch plan
    sourcing: str = "switch"
    # measures the agents' links once per pair (issue 32); None: `links` as given
    probe: link_probe.LinkProbe | None = None


@control.reconcile_pass  # counted, timed and traced (docs/observability.md)
async def converge(
    dep: api.ServingDeployment,
    model_path: str,
    refs: Sequence[agents.AgentRef],
    progress: actuate.Progress | None = None,
    auto_planner: plan.AutoPlanner | None = None,
    apply: bool = True,
    on_steps: Callable[[transition.Transition], None] | None = None,
    published: routes_doc.RoutesDoc | None = None,
    publish: outcome.Publish | None = None,
    rollout: Rollout | None = None,
    shared: observation.Observation | None = None,
    replicas_cap: int | None = None,
    *,
    tls: transport.TlsFiles | None,
) -> outcome.Outcome:
    """One pass. `published` is the routes document the gateway was last given (None:
    none yet); `publish(doc, plan)` writes a new one (a cut-over: the replica set,
    version, deadline and time, filled with the model, classes and class shares of
    `plan`, the plan being moved to). `shared` is the pass's observation of `refs`, shared
    with the loops ticked in the same pass (an observation made already is used, and the
    one this pass ends with is left there); None: the pass observes on its own.
    `replicas_cap`: the autoscaler's plan count for an auto layout (`plan.make_plan`)."""
    rollout = rollout or Rollout()
    shape = model_facts.served_shape(model_path, dep.spec.model.dtype)
    errs = api_semantics.check_semantics(dep.spec, shape, [r.name for r in refs])
    if errs:
        if shape is None:
            errs[0] = fields.FieldError(
                "spec.model.path", f"model not readable: no config.json in {model_path}"
            )
        return outcome.Outcome(
            "InvalidSpec", "; ".join(str(e) for e in errs), errors=errs, routes=published
        )
    assert shape is not None
    prefix = plan.owner_prefix(dep)
    seen = shared if shared is not None else observation.Observation(refs, tls=tls)
    obs = await seen.get()
    link_model = rollout.links
    if rollout.probe is not None and apply:  # measured per agent pair, cached by the probe
        link_model = await rollout.probe.links(rollout.links, obs, model_path)
    auto = auto_planner or planner_auto.default_auto_planner()
    floor = published.version if published is not None else 0
    try:
        desired = plan.make_plan(dep, shape, obs, model_path, auto, floor, replicas_cap)
    except plan.PlanError as exc:
        return outcome.Outcome(
            exc.reason,
            exc.message,
            observed=obs,
            routes=published,
            serving=serving(obs, prefix, published),
        )
    overload_on = dep.spec.policies.overload.enabled
    chosen = variant_ops.resolve(dep.spec.variants, model_path)
    sharing = await variant_ops.observed_sharing(chosen, obs, tls)  # opted-in chains' own layers

    def wanted(o: observed.Observed) -> tuple[overload_desired.Desired, transition.Target]:
        # an active overload drop is desired, not drift (docs/overload.md)
        held = overload_desired.desired(reconcile.target(desired, o), o, overload_on)
        full = variant_plan.with_full_chains(  # full fine-tunes
            held.target, chosen, sharing=sharing, model=switch_model(shape)
        )
        # beside the foundation's stages when memory allows, else by locality (issue 35)
        full = variant_place.place(
            held.target, full, chosen, model_path, bytes_of, o, prefix
        ).target
        # stitched chains (issue 35), placed by the locality-aware policy
        stitched = stitch_ops.place(full, chosen, model_path, bytes_of, o, prefix)
        # speculated chains (issue 35), beside the foundation's stages
        return held, speculate_ops.place(stitched.target, chosen).target

    def bytes_of(path: str) -> placement.ModelBytes | None:
        found = model_facts.served_shape(path, dep.spec.model.dtype)
        return switch_model(found) if found is not None else None

    held, target = wanted(obs)
    foundation = [r.id for r in held.target.replicas]
    chains = {r.id for r in target.replicas} - set(foundation)

    drain = rollout.drain
    if rollout.drain_deadline_s is not None:
        drain = dataclasses.replace(drain, deadline_s=rollout.drain_deadline_s)

    def world(o: observed.Observed, routes: routes_doc.RoutesDoc | None) -> transition.World:
        return transition.World(
            o,
            prefix,
            routes,
            rollout.clock(),
            links=link_model,
            drain=drain,
            sourcing=rollout.sourcing,
            model=switch_model(shape),
        )

    t = transition.plan(world(obs, published), target)
    out = outcome.Outcome("Serving", "", plan=desired, transition=t, observed=obs, routes=published)
    if on_steps is not None:
        on_steps(t)  # e.g. size a progress bar before anything is applied

    async def cut_over(cut: step_actions.CutOver) -> None:
        doc = filled(
            dep,
            desired,
            model_path,
            routes_doc.RoutesDoc(cut.replicas, cut.version, cut.drain_deadline_s, rollout.clock()),
        )
        if chosen:  # which names the new replica set serves (LoRA: as attached so far)
            was = out.routes or published
            lora = frozenset(v.name for v in (was.variants if was else ()) if v.kind == "lora")
            fids = [r for r in doc.replica_ids if r not in chains]
            doc = dataclasses.replace(doc, variants=variant_plan.routes(chosen, fids, lora))
        if publish is not None:
            await publish(doc, desired)
        out.routes = doc

    if apply and t.steps:
        with control.action("transition", t.mode, deployment=prefix, steps=len(t.steps)):
            out.results = await actuate.execute(
                t, world(obs, published), cut_over, progress, tls=tls
            )
        seen.acted()
        obs = await seen.get()
        out.observed = obs
    if chosen or (published is not None and published.variants):
        await converge_variants.apply(
            out, chosen, target, foundation, chains, prefix, apply, publish, desired, tls
        )
        obs = out.observed or obs
    now, now_target = wanted(obs)
    after = transition.plan(world(obs, out.routes), now_target)
    out.remaining = after
    ready = now.members | set(ready_replicas(desired, obs))  # a dropped group serves
    out.ready_replicas = [r.replica_id for r in desired.replicas if r.replica_id in ready]
    out.serving = serving(obs, prefix, out.routes)
    down = [a for a in obs.agents if not a.reachable]
    step = out.current_step
    first = out.failed[0] if out.failed else None
    out.reason, out.message = pass_reason.reason(
        pass_reason.PassFacts(
            failed=pass_reason.Failed(first.code, first.action.describe(), first.message)
            if first is not None
            else None,
            blocked=(after.blocked.reason, after.blocked.message)
            if after.blocked is not None
            else None,
            down=[pass_reason.Down(a.name, a.address, a.error) for a in down],
            next_step=step.action.describe() if step is not None else "",
            generation=after.generation if step is not None else desired.generation,
            mode=after.mode,
            steps_left=len(after.steps),
            serving=bool(out.serving),
            ready=len(out.ready_replicas),
            planned=len(desired.replicas),
            source=desired.source,
        )
    )
    return out
