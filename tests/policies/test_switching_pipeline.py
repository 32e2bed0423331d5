"""The pure pieces compose: forecast mix -> plan -> modelled latency -> switch plan -> decide."""

from __future__ import annotations

import dataclasses
import math

from tessera.cost.capacity import RequestClass
from tessera.planner import capacity_table, search
from tessera.planner.latency import LatencyModel
from tessera.planner.problem import PlanningProblem
from tessera.policies import device_links, placement
from tessera.policies.switching import gain as switching
from tessera.policies.switching import switch_bound, switch_plan
from tessera.policies.switching.gain import DeploymentCost, HysteresisState, SwitchingConfig
from tests.planner import planner_helpers as helpers


def _problem(rates: tuple[float, float]) -> PlanningProblem:
    classes = (
        RequestClass("chat", 300, 60, rates[0]),
        RequestClass("doc", 6000, 40, rates[1]),
    )
    return helpers.problem(name="llama-2-70b", classes=classes)


def test_a_mix_shift_plans_prices_and_decides() -> None:
    # Llama-2-70B on 2x4 H100 (analytic profile): chats dominate, then long documents.
    before, after = _problem((8.0, 0.2)), _problem((0.5, 3.0))
    current = search.plan(before)
    candidate = search.plan(after)
    table = capacity_table.build_table(after)
    model = LatencyModel(after, table)
    forecast = tuple(d * 0.6 * candidate.scale for d in after.demand)  # 60 % of its capacity
    cur = model.deployment(current, forecast)
    new = model.deployment(candidate, forecast)
    assert cur.p99_latency_s == math.inf  # the chat layout cannot serve the documents
    assert new.p99_latency_s < math.inf
    mb = placement.model_bytes(after.profile)
    links = device_links.from_comm(after.comm, 2e9)
    src, tgt = placement.from_deployment(current), placement.from_deployment(candidate)
    plan = switch_plan.plan(src, tgt, mb, links)
    lower = switch_bound.bound(src, plan, mb, links)
    assert plan.seconds >= lower.seconds * (1 - 1e-9)
    assert plan.bytes_from_storage == 0.0  # every replica held the whole model
    assert plan.bytes_moved > 0 and plan.seconds > 0
    config = SwitchingConfig(enabled=True, mode="advisory", hold_spans=1, min_gain=0.0)
    label_cur = " ".join(f"tp{r.tp}pp{r.pp}" for r in current.replicas)
    label_new = " ".join(f"tp{r.tp}pp{r.pp}" for r in candidate.replicas)
    decision = switching.decide(
        config,
        HysteresisState(),
        DeploymentCost(label_cur, cur.p99_latency_s),
        DeploymentCost(label_new, new.p99_latency_s),
        sum(forecast),
        plan.seconds,
    )
    assert label_cur != label_new
    assert decision.action == "recommend" and "cannot serve" in decision.reason
    active = dataclasses.replace(config, mode="active")
    again = switching.decide(
        active,
        HysteresisState(),
        DeploymentCost(label_cur, cur.p99_latency_s),
        DeploymentCost(label_new, new.p99_latency_s),
        sum(forecast),
        plan.seconds,
    )
    assert again.action == "switch"
