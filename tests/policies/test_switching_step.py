"""The predictive loop's step: the forecast method is the one best on the recent window,
the plan is the cheapest candidate at the forecast, and the decision applies the gain vs
switch-cost rule with hysteresis (advisory recommends, active switches)."""

from __future__ import annotations

import pytest

from tessera.policies.switching import gain as switching
from tessera.policies.switching import step as switching_step
from tessera.workload import baselines

SPAN = 10.0


def _price(name: str, demand: tuple[float, ...]) -> float:
    """ "A" suits class 0, "B" class 1: latency grows with the other class's share."""
    total = sum(demand)
    other = demand[1] if name == "A" else demand[0]
    return 1.0 + 4.0 * other / total


def _config(mode: str = "active", **kw: float) -> switching.SwitchingConfig:
    return switching.SwitchingConfig(True, mode, SPAN, 0.1, **kw)  # type: ignore[arg-type]


def test_forecast_uses_the_method_best_on_the_window() -> None:
    alternating = [[10.0, 0.0], [0.0, 10.0]] * 8  # period 2: seasonal is exact
    f = switching_step.forecast(alternating, window=5)
    assert f.method == "seasonal" and f.rrmse["seasonal"] == pytest.approx(0.0)
    assert f.rrmse["last_value"] > 1.0
    assert f.counts == pytest.approx((10.0, 0.0))  # the span after [0, 10]
    steady = [[5.0, 5.0]] * 6
    g = switching_step.forecast(steady, window=5)
    assert g.method == "last_value" and g.counts == pytest.approx((5.0, 5.0))  # ties: cheapest


def test_forecast_of_one_span_is_last_value() -> None:
    f = switching_step.forecast([[3.0, 1.0]])
    assert (f.method, f.counts, f.window, dict(f.rrmse)) == ("last_value", (3.0, 1.0), 0, {})
    with pytest.raises(ValueError):
        switching_step.forecast([[1.0]], window=0)


def _run(mode: str, history: list[list[float]], spans: int) -> list[switching_step.LoopStep]:
    """Feed the loop span by span from span 1 on; the current deployment follows switches."""
    state, current, out = switching.HysteresisState(), "A", []
    for t in range(1, spans + 1):
        s = switching_step.step(
            _config(mode), state, history[:t], current, ["A", "B"], _price, lambda a, b: 1.0
        )
        out.append(s)
        state = s.state
        if s.decision.action == switching.SWITCH:
            current = s.decision.candidate
    return out


def test_a_lasting_shift_switches_once_after_the_hold() -> None:
    history = [[20.0, 1.0]] * 4 + [[1.0, 20.0]] * 6
    steps = _run("active", history, len(history))
    actions = [s.decision.action for s in steps]
    assert actions.count(switching.SWITCH) == 1
    i = actions.index(switching.SWITCH)
    assert i == 5  # spans 5 and 6 are the first two whose last-value forecast favours B
    assert steps[i].decision.candidate == "B"
    assert steps[i - 1].decision.reason.startswith("candidate has won 1 of 2")
    assert steps[i].latencies["A"] > steps[i].latencies["B"]
    assert all(s.current == "B" for s in steps[i + 1 :])


def test_advisory_recommends_and_never_switches() -> None:
    history = [[20.0, 1.0]] * 4 + [[1.0, 20.0]] * 6
    steps = _run("advisory", history, len(history))
    actions = [s.decision.action for s in steps]
    assert switching.SWITCH not in actions and actions.count(switching.RECOMMEND) >= 4
    rec = next(s for s in steps if s.decision.action == switching.RECOMMEND)
    doc = rec.to_json()
    assert doc["current"] == "A" and doc["lastDecision"]["candidate"] == "B"
    assert doc["lastDecision"]["expectedGain"] > doc["lastDecision"]["switchCost"]
    assert "advisory" in doc["lastDecision"]["reason"]
    assert switching_step.state_from_json(doc["hysteresis"]) == rec.state


def test_a_flickering_mix_never_switches() -> None:
    """Last value alone flips its forecast every span: the candidate never wins twice in a
    row, so the hold keeps the deployment."""
    history = [[20.0, 1.0], [1.0, 20.0]] * 8
    state, actions = switching.HysteresisState(), []
    for t in range(1, len(history) + 1):
        s = switching_step.step(
            _config(),
            state,
            history[:t],
            "A",
            ["A", "B"],
            _price,
            lambda a, b: 1.0,
            methods=lambda: {"last_value": baselines.LastValue()},
        )
        state = s.state
        actions.append(s.decision.action)
    assert set(actions) == {switching.STAY}


def test_no_demand_and_ties_stay() -> None:
    s = switching_step.step(
        _config(), switching.HysteresisState(), [[0.0, 0.0]] * 3, "A", ["A", "B"], _price, max
    )
    assert s.decision.action == switching.STAY and "no demand" in s.decision.reason
    flat = switching_step.step(
        _config(),
        switching.HysteresisState(),
        [[5.0, 5.0]] * 3,
        "A",
        ["B", "A"],
        lambda n, d: 2.0,
        lambda a, b: 1.0,
    )
    assert flat.decision.candidate == "A" and flat.decision.action == switching.STAY


def test_a_switch_longer_than_the_gain_stays() -> None:
    history = [[1.0, 20.0]] * 5
    slow = switching_step.step(
        _config(),
        switching.HysteresisState(),
        history,
        "A",
        ["A", "B"],
        _price,
        lambda a, b: 9.0,
    )
    assert slow.decision.action == switching.STAY and "does not pay" in slow.decision.reason


def test_bad_price_is_an_error() -> None:
    with pytest.raises(ValueError, match="latency must be > 0"):
        switching_step.step(
            _config(),
            switching.HysteresisState(),
            [[1.0, 1.0]],
            "A",
            ["A"],
            lambda n, d: 0.0,
            lambda a, b: 0.0,
        )
    with pytest.raises(ValueError, match="no candidate"):
        switching_step.step(
            _config(), switching.HysteresisState(), [[1.0, 1.0]], "A", [], _price, max
        )


def test_a_deployment_is_priced_at_the_worse_of_forecast_and_last_span() -> None:
    # period 2: the seasonal forecast says class 0 next while the last span was class 1.
    # Each deployment is priced at the worse of the two (a forecast can lag a change of
    # mix); here both are as bad at one of them, so the current stays.
    alternating = [[10.0, 0.0], [0.0, 10.0]] * 8
    demand = (1.0, 0.0)
    assert switching_step.plausible(demand, alternating, SPAN) == ((1.0, 0.0), (0.0, 1.0))
    assert switching_step.plausible((0.0, 1.0), alternating, SPAN) == ((0.0, 1.0),)
    s = switching_step.step(
        _config(),
        switching.HysteresisState(),
        alternating,
        "B",
        ["A", "B"],
        _price,
        lambda a, b: 1.0,
    )
    assert s.forecast.method == "seasonal" and s.demand_rps == pytest.approx(demand)
    assert s.latencies == {"B": 5.0, "A": 5.0}  # forecast alone: A 1.0, B 5.0
    assert s.decision.action == switching.STAY


def test_worst_case_price_keeps_a_deployment_that_serves_both_mixes() -> None:
    # "C" serves either class at 2.0; "A" is best at the forecast but bad at the mix
    # that just arrived: the worst case prefers C, the forecast alone would take A.
    def price(name: str, demand: tuple[float, ...]) -> float:
        return 2.0 if name == "C" else _price(name, demand)

    history = [[10.0, 0.0], [0.0, 10.0]] * 8
    s = switching_step.step(
        _config(),
        switching.HysteresisState(),
        history,
        "B",
        ["A", "B", "C"],
        price,
        lambda a, b: 0.0,
    )
    assert s.latencies["C"] == 2.0 and s.latencies["A"] == 5.0
    assert s.decision.candidate == "C"


def test_a_last_span_within_the_forecasts_noise_is_not_priced_apart() -> None:
    # 60 s spans of ~1,000 arrivals: a span drawn from the forecast's rates is its Poisson
    # noise (priced at the forecast alone); a span of another mix is priced as well
    demand = (3.0, 3.1, 5.5, 4.3)  # req/s
    noisy = [[170.0, 205.0, 342.0, 282.0]]  # within ~2 sd per class of 180, 186, 330, 258
    assert switching_step.plausible(demand, noisy, 60.0) == (demand,)
    other = [[300.0, 280.0, 250.0, 190.0]]
    assert switching_step.plausible(demand, other, 60.0) == (
        demand,
        (5.0, 280 / 60, 250 / 60, 190 / 60),
    )


def test_regime_mean_forecasts_a_steady_mix_from_every_span_since_it_began() -> None:
    # Table 2's T2 up to 420 s (simulation counts): four spans of S1, then three of S3
    s1 = [[254, 277, 262, 195], [258, 254, 291, 203], [246, 285, 259, 200], [264, 242, 281, 187]]
    s3 = [[186, 183, 340, 250], [175, 177, 318, 255], [170, 205, 342, 282]]
    f = switching_step.forecast(s1 + s3)
    assert f.method == "regime_mean" and f.rrmse["regime_mean"] < f.rrmse["last_value"]
    assert f.counts == pytest.approx(tuple(sum(c) / 3 for c in zip(*s3, strict=True)))
