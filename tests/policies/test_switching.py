"""The switching decision: pays-for-itself rule, hysteresis, modes, config from the spec."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera import api, fields
from tessera.policies.switching import gain as switching
from tessera.policies.switching.gain import DeploymentCost, HysteresisState, SwitchingConfig

ACTIVE = SwitchingConfig(enabled=True, mode="active", span_s=60.0, min_gain=0.1)
A = DeploymentCost("A", 2.0)
B = DeploymentCost("B", 1.0)  # twice as fast as A


def run(
    config: SwitchingConfig,
    state: HysteresisState,
    current: DeploymentCost,
    candidate: DeploymentCost,
    switch_s: float = 5.0,
) -> switching.SwitchDecision:
    return switching.decide(config, state, current, candidate, rate_rps=10.0, switch_s=switch_s)


def test_disabled_or_same_deployment_stays() -> None:
    off = SwitchingConfig(enabled=False)
    assert run(off, HysteresisState(), A, B).action == "stay"
    assert "disabled" in run(off, HysteresisState(), A, B).reason
    same = run(ACTIVE, HysteresisState(), A, DeploymentCost("A", 1.0))
    assert same.action == "stay" and "planner's choice" in same.reason


def test_switches_after_hold_spans_and_reports_gain_and_cost() -> None:
    first = run(ACTIVE, HysteresisState(), A, B)
    assert first.action == "stay" and "1 of 2" in first.reason
    second = run(ACTIVE, first.state, A, B)
    assert second.action == "switch"
    # gain = 10 req/s * (60 - 5) s * (2 - 1) s; cost = 10 * 5 * 1.0 * 2
    assert math.isclose(second.expected_gain, 550.0)
    assert math.isclose(second.switch_cost, 100.0)
    assert math.isclose(second.relative_gain, 1.0)
    assert second.state.spans_since_switch == 0


def test_must_pay_for_itself() -> None:
    slow = 55.0  # gain 10*5*1 = 50 < cost 10*55*2 = 1100
    state = HysteresisState("B", 5, switching.NEVER)
    d = run(ACTIVE, state, A, B, switch_s=slow)
    assert d.action == "stay" and "does not pay" in d.reason
    assert d.state.streak == 0  # a losing span breaks the streak
    assert run(ACTIVE, state, A, B, switch_s=60.0).reason.startswith("switch takes")
    small = run(ACTIVE, state, A, DeploymentCost("C", 1.9))  # 5 % faster < minGain 10 %
    assert small.action == "stay" and "below minGain" in small.reason


def test_no_flapping_when_the_mix_flickers() -> None:
    # The forecast alternates between favouring B and favouring A (the current one):
    # the candidate never wins two spans in a row, so nothing ever switches.
    state, current = HysteresisState(), A
    for span in range(20):
        candidate = B if span % 2 == 0 else DeploymentCost("A", 2.0)
        d = run(ACTIVE, state, current, candidate)
        assert d.action == "stay"
        state = d.state


def test_cooldown_prevents_switching_back_at_once() -> None:
    eager = SwitchingConfig(enabled=True, mode="active", hold_spans=1, cooldown_spans=2)
    state, current = HysteresisState(), "A"
    actions, reasons = [], []
    for span in range(4):  # B is best in span 0, A from span 1 on
        best = "B" if span == 0 else "A"
        cur = DeploymentCost(current, 1.0 if current == best else 2.0)
        d = run(eager, state, cur, DeploymentCost(best, 1.0))
        actions.append(d.action)
        reasons.append(d.reason)
        current = best if d.action == "switch" else current
        state = d.state
    assert actions == ["switch", "stay", "switch", "stay"]
    assert reasons[1].startswith("cooling down")


def test_advisory_recommends_and_changes_nothing() -> None:
    advisory = SwitchingConfig(enabled=True, mode="advisory")
    d1 = run(advisory, HysteresisState(), A, B)
    d2 = run(advisory, d1.state, A, B)
    assert d2.action == "recommend" and "advisory" in d2.reason
    assert d2.state.spans_since_switch == switching.NEVER  # no switch recorded
    assert d2.to_json()["expectedGain"] == pytest.approx(550.0)


def test_infeasible_current_switches_at_once() -> None:
    broken = DeploymentCost("A", math.inf)
    state = HysteresisState(None, 0, 0)  # even right after a switch
    d = run(ACTIVE, state, broken, B)
    assert d.action == "switch" and "cannot serve" in d.reason
    assert d.to_json()["relativeGain"] is None


@settings(max_examples=200, deadline=None)
@given(
    st.floats(0.01, 100),
    st.floats(0.01, 100),
    st.floats(0, 200),
    st.floats(0, 100),
    st.integers(0, 5),
    st.integers(0, 10),
)
def test_a_switch_always_pays_and_clears_min_gain(
    cur: float, cand: float, switch_s: float, rate: float, streak: int, since: int
) -> None:
    state = HysteresisState("B", streak, since)
    d = switching.decide(
        ACTIVE, state, DeploymentCost("A", cur), DeploymentCost("B", cand), rate, switch_s
    )
    if d.action == "switch":
        assert d.expected_gain > d.switch_cost
        assert d.relative_gain >= ACTIVE.min_gain
        assert switch_s < ACTIVE.span_s
        assert since + 1 >= ACTIVE.cooldown_spans and streak + 1 >= ACTIVE.hold_spans


def test_config_from_spec_and_validation() -> None:
    spec = api.SwitchingSpec(enabled=True, mode="active", span_seconds=30.0, min_gain=0.2)
    config = switching.config_from_spec(spec, hold_spans=3)
    assert (config.mode, config.span_s, config.min_gain, config.hold_spans) == (
        "active",
        30.0,
        0.2,
        3,
    )
    with pytest.raises(fields.FieldError, match="mode"):
        SwitchingConfig(mode="yolo")
    with pytest.raises(fields.FieldError, match="minGain"):
        SwitchingConfig(min_gain=-0.1)


def _doc(switching_doc: object) -> dict[str, object]:
    return {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.KIND,
        "metadata": {"name": "m"},
        "spec": {"model": {"name": "m", "path": "/m"}, "policies": {"switching": switching_doc}},
    }


def test_api_parses_switching_spec_with_clear_errors() -> None:
    parsed = api.parse(
        _doc({"enabled": True, "mode": "active", "spanSeconds": 30, "minGain": 0.05})
    )
    assert parsed.spec.policies.switching == api.SwitchingSpec(True, "active", 30.0, 0.05)
    assert api.parse(_doc({})).spec.policies.switching == api.SwitchingSpec()
    for bad, where in (
        ({"mode": "sometimes"}, "spec.policies.switching.mode"),
        ({"spanSeconds": 0}, "spec.policies.switching.spanSeconds"),
        ({"minGain": -1}, "spec.policies.switching.minGain"),
        ({"hold": 2}, "spec.policies.switching.hold"),
    ):
        with pytest.raises(fields.FieldError) as err:
            api.parse(_doc(bad))
        assert str(err.value).startswith(where), str(err.value)
