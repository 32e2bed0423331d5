"""The loop on the planner's own candidates (model output): the layout the latency
objective prefers follows the mix, switch times come from the greedy switch plan, and one
pure step goes forecast → plan → decision."""

from __future__ import annotations

import math

import pytest

from tessera.cost.capacity import RequestClass
from tessera.planner import capacity_table
from tessera.policies.switching import gain as switching
from tessera.policies.switching import planner as switching_planner
from tessera.policies.switching import step as switching_step
from tests.planner import planner_helpers as helpers

CLASSES = (RequestClass("chat", 200, 100, 1.0), RequestClass("doc", 6000, 20, 1.0))


@pytest.fixture(scope="module")
def planned() -> switching_planner.PlannedCandidates:
    problem = helpers.problem(classes=CLASSES, nodes=1, gpus=4)
    return switching_planner.candidates(problem, capacity_table.build_table(problem))


def _best(c: switching_planner.PlannedCandidates, demand: tuple[float, ...]) -> str:
    return min(c.deployments, key=lambda n: c.price(n, demand))


def test_the_preferred_layout_follows_the_mix(
    planned: switching_planner.PlannedCandidates,
) -> None:
    chats, docs = _best(planned, (8.0, 0.5)), _best(planned, (0.5, 3.0))
    assert chats != docs
    assert math.isinf(planned.price(chats, (1e4, 1e4)))  # past capacity
    with pytest.raises(ValueError, match="classes"):
        planned.price(chats, (1.0,))


def test_switch_time_is_the_switch_plan(planned: switching_planner.PlannedCandidates) -> None:
    names = list(planned.deployments)
    whole, split = "1x[tp1pp1 tp1pp1 tp1pp1 tp1pp1]", "1x[tp1pp4]"
    assert {whole, split} <= set(names)
    assert planned.switch_seconds(whole, whole) == 0.0
    # four whole copies already hold every pipeline stage; the way back must copy
    assert planned.switch_seconds(whole, split) == 0.0
    assert 0.0 < planned.switch_seconds(split, whole) < math.inf


def test_a_step_on_planner_candidates(planned: switching_planner.PlannedCandidates) -> None:
    span = 60.0
    chats, docs = _best(planned, (8.0, 0.5)), _best(planned, (0.5, 3.0))
    history = [[480.0, 30.0]] * 4 + [[30.0, 180.0]] * 2  # per 60 s span: the mix turns
    cfg = switching.SwitchingConfig(True, "active", span, 0.1, hold_spans=1)
    s = switching_step.step(
        cfg,
        switching.HysteresisState(),
        history,
        chats,
        list(planned.deployments),
        planned.price,
        planned.switch_seconds,
    )
    assert s.forecast.counts == pytest.approx((30.0, 180.0))
    assert s.decision.candidate == docs == min(s.latencies, key=lambda n: s.latencies[n])
    assert s.decision.action == switching.SWITCH, s.decision.reason
    assert s.decision.switch_s == planned.switch_seconds(chats, docs)
