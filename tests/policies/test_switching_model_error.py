"""The switching decision's threshold comes from the latency model's measured error
(issue 34): a gain the model's error on both deployments could explain never switches;
without a measured error the decision falls back to minGain."""

from __future__ import annotations

import pytest

from tessera import fields
from tessera.policies.switching import gain as switching

CFG = switching.SwitchingConfig(
    enabled=True, mode="active", span_s=60.0, min_gain=0.1, hold_spans=1, cooldown_spans=0
)


def _decide(cur: switching.DeploymentCost, cand: switching.DeploymentCost) -> str:
    return switching.decide(CFG, switching.HysteresisState(), cur, cand, 10.0, 1.0).action


def test_threshold_from_the_errors_of_both_layouts() -> None:
    cur = switching.DeploymentCost("a", 1.15, model_error=0.05)
    cand = switching.DeploymentCost("b", 1.0, model_error=0.05)
    need = switching.gain_threshold(CFG, cur, cand)
    assert need == pytest.approx(1.05 / 0.95 - 1)  # 10.5 %
    assert _decide(cur, cand) == switching.SWITCH  # 15 % > 10.5 %
    noisy = switching.DeploymentCost("b", 1.0, model_error=0.2)
    d = switching.decide(CFG, switching.HysteresisState(), cur, noisy, 10.0, 1.0)
    assert d.action == switching.STAY and "error" in d.reason  # 15 % < 1.2 / 0.95 - 1


def test_a_small_error_lowers_the_bar_below_min_gain() -> None:
    cur = switching.DeploymentCost("a", 1.05, model_error=0.01)
    cand = switching.DeploymentCost("b", 1.0, model_error=0.01)
    assert _decide(cur, cand) == switching.SWITCH  # 5 % gain, 2 % error: switch
    plain = switching.DeploymentCost("b", 1.0)
    assert _decide(cur, plain) == switching.STAY  # unmeasured: minGain 10 % applies


def test_error_must_be_a_fraction() -> None:
    with pytest.raises(fields.FieldError):
        switching.DeploymentCost("a", 1.0, model_error=1.0)
