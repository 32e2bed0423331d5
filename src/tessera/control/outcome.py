"""What one converge pass saw and did (`Outcome`), and how it publishes routes (`Publish`).

`converge.converge` builds an `Outcome` (its reason, plan, transition, results, observation,
routes and variant status) and the shells read it: the operator writes status, conditions
and events from it (`status`, `overload_status`, `replica_status`, `reconciler`); `tessera
up` prints it. `Publish` is the shell's callback that writes a new routes document.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tessera import fields, observed, plan, routes_doc
from tessera.control import actuate
from tessera.policies.transition import actions as step_actions
from tessera.policies.transition import planner as transition
from tessera.policies.variants import plan as variant_plan

Publish = Callable[[routes_doc.RoutesDoc, plan.Plan], Awaitable[None]]
Transition = transition.Transition  # the field `transition` shadows the module in the class


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
