"""One level-triggered pass: validate, observe, plan, transition and apply — shared by every shell.

`converge()` is what the operator's handlers and timer call and what `tessera up` runs:
1. semantic checks of the spec against the model's config.json and the known agents;
2. observe the agents (`Describe`; through the pass's shared `observation.Observation`
   when the shell gives one, so the loops ticked in the same pass reuse it);
3. plan (`tessera.plan.make_plan`), the generation floored at the routes version
   already published;
4. plan the transition from what the agents hold and the routes published
   (`tessera.policies.transition.planner.plan`);
5. execute the steps that can be done now (`actuate.execute`; a cut-over calls the
   shell's `publish`), observe again (the agents changed) and re-plan to say where
   things stand.
It returns everything the caller needs to write status, conditions and events; it never
raises for a bad spec or an unreachable agent — those become a `reason`. Nothing of a
transition is remembered between passes: the next pass re-plans from observation.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
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
    variant_spec,
)
from tessera.control import (
    actuate,
    agents,
    link_probe,
    observation,
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

Publish = Callable[[routes_doc.RoutesDoc, plan.Plan], Awaitable[None]]
Transition = transition.Transition


@dataclass
class Outcome:
    """What one pass saw and did. `reason` is a condition reason: "Serving" when done,
    "Switching" while a transition runs with a complete generation serving, "Loading"
    while none serves yet, or why the pass could not proceed."""

    reason: str
    message: str
    plan: plan.Plan | None = None
    transition: Transition | None = None  # as planned at the pass's start
    remaining: Transition | None = None  # as re-planned at its end
    results: list[actuate.Result] = field(default_factory=list)
    observed: observed.Observed | None = None
    errors: list[fields.FieldError] = field(default_factory=list)
    ready_replicas: list[str] = field(default_factory=list)
    routes: routes_doc.RoutesDoc | None = None  # published at the end of the pass
    serving: list[str] = field(default_factory=list)  # routed replicas with every block
    variants: list[variant_plan.VariantStatus] = field(default_factory=list)  # issue 14

    @property
    def whole(self) -> bool:
        """A complete generation serves: the routes name replicas, each with every block
        loaded (the old set during a transition, the new one after its cut-over)."""
        return (
            self.routes is not None
            and bool(self.routes.replicas)
            and len(self.serving) == len(self.routes.replicas)
        )

    @property
    def failed(self) -> list[actuate.Result]:
        return [r for r in self.results if not r.ok and not r.waiting]

    @property
    def actions(self) -> list[step_actions.Action]:
        return [s.action for s in self.transition.steps] if self.transition else []

    @property
    def current_step(self) -> step_actions.Step | None:
        """The first step still to do, when a transition runs."""
        if self.remaining is None or not self.remaining.steps:
            return None
        return self.remaining.steps[0]


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
    publish: Publish | None = None,
    rollout: Rollout | None = None,
    shared: observation.Observation | None = None,
    replicas_cap: int | None = None,
) -> Outcome:
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
        return Outcome(
            "InvalidSpec", "; ".join(str(e) for e in errs), errors=errs, routes=published
        )
    assert shape is not None
    prefix = plan.owner_prefix(dep)
    seen = shared if shared is not None else observation.Observation(refs)
    obs = await seen.get()
    link_model = rollout.links
    if rollout.probe is not None and apply:  # measured per agent pair, cached by the probe
        link_model = await rollout.probe.links(rollout.links, obs, model_path)
    auto = auto_planner or planner_auto.default_auto_planner()
    floor = published.version if published is not None else 0
    try:
        desired = plan.make_plan(dep, shape, obs, model_path, auto, floor, replicas_cap)
    except plan.PlanError as exc:
        return Outcome(
            exc.reason,
            exc.message,
            observed=obs,
            routes=published,
            serving=serving(obs, prefix, published),
        )
    overload_on = dep.spec.policies.overload.enabled
    chosen = variant_ops.resolve(dep.spec.variants, model_path)
    sharing = await variant_ops.observed_sharing(chosen, obs)  # opted-in chains' own layers

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
    out = Outcome("Serving", "", plan=desired, transition=t, observed=obs, routes=published)
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
            out.results = await actuate.execute(t, world(obs, published), cut_over, progress)
        seen.acted()
        obs = await seen.get()
        out.observed = obs
    if chosen or (published is not None and published.variants):
        await _variants(out, chosen, target, foundation, chains, prefix, apply, publish, desired)
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


async def _variants(
    out: Outcome,
    chosen: Sequence[variant_spec.VariantSpec],
    target: transition.Target,
    foundation: list[str],
    chains: set[str],
    prefix: str,
    apply: bool,
    publish: Publish | None,
    desired: plan.Plan,
) -> None:
    """LoRA adapters onto the foundation's stages, the variants' routes and status."""
    placed = [
        (p.agent, p.address, p.block.replica_id, p.block.stage_index, p.block.num_stages)
        for p in target.blocks
        if p.block.replica_id in foundation and p.block.tp_rank == 0
    ]
    applied = await variant_ops.apply_adapters(chosen, placed, apply=apply)
    lora = applied.lora_ready([v.name for v in chosen if v.kind == "lora"])
    if out.routes is not None:
        fids = [r for r in out.routes.replica_ids if r not in chains]
        want = variant_plan.routes(chosen, fids, lora)
        if want != out.routes.variants and apply:
            doc = dataclasses.replace(out.routes, variants=want)
            if publish is not None:
                await publish(doc, desired)
            out.routes = doc
    if out.observed is not None:
        complete = frozenset(transition.complete_replicas(out.observed, prefix))
        per = {
            v.name: [variant_plan.variant_replica_id(f, v.name) for f in foundation] for v in chosen
        }
        eq = await variant_ops.observe_equivalence(
            [
                (p.agent, p.address, p.block.replica_id, p.block.stage_index, p.block.num_stages)
                for p in target.blocks
                if p.block.share_from and p.block.tp_rank == 0
            ],
            {rid: name for name, rids in per.items() for rid in rids},
        )
        of = {rid: name for name, rids in per.items() for rid in rids}
        st = await stitch_ops.observe(target, of)
        for v in chosen:
            if v.kind == "stitch":
                where = stitch_ops.lines(target, v.name, per[v.name])
                st[v.name] = {**st.get(v.name, {"point": list(v.point)}), "placement": where}
        sp = await speculate_ops.observe(target, of)
        for v in chosen:
            if v.kind == "speculate":
                where = speculate_ops.lines(target, v.name, per[v.name])
                sp[v.name] = {**sp.get(v.name, {"layers": list(v.layers)}), "placement": where}
        out.variants = variant_plan.status(
            chosen, applied.held, per, complete, applied.errors, eq, st, sp
        )
