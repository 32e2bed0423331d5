"""Algorithm 1 with a measured gamma: the link term the scaling driver derives from it.

The driver (`tessera/control/scaling_driver.py`) turns a measured gamma into Eq. 2's bandwidth
B = C / (d * gamma); these check that Algorithm 1 then replicates when the round trip
is cheap and refuses when it costs more than the compute it saves (the 2-core case).
"""

from __future__ import annotations

import pytest

from tessera.policies.scaling import module_scaling as ms
from tessera.policies.scaling import speedup as sp

D = 256


def _plan(gamma: float) -> ms.ScaleUpPlan:
    bw = float("inf") if gamma == 0 else 1.0 / (D * gamma)
    devices = {
        "a": sp.Device("a", 1.0, float("inf"), 0, 0.0),
        "b": sp.Device("b", 1.0, bw, 1 << 30, 1.0),
    }
    return ms.scale_up(
        sp.Placement.initial("a", 8),
        devices,
        sp.Workload(D, 4, 1),
        4 << 20,
        ms.ScalingConfig(enabled=True),
    )


@pytest.mark.parametrize("gamma", [0.0, 0.05, 0.5])
def test_cheap_round_trip_replicates(gamma: float) -> None:
    plan = _plan(gamma)
    assert plan.actions and plan.speedup_after > 1.0


@pytest.mark.parametrize("gamma", [1.0, 1.2, 3.0])
def test_round_trip_dearer_than_the_saved_compute_is_refused(gamma: float) -> None:
    plan = _plan(gamma)
    assert plan.actions == () and plan.speedup_after == 1.0


def test_measured_gamma_matches_the_homogeneous_form() -> None:
    """Eq. 3 with B = C/(d gamma) equals Eq. 4 with that gamma (all layers at p = 2)."""
    gamma = 0.3
    devices = {
        "a": sp.Device("a", 1.0),
        "b": sp.Device("b", 1.0, 1.0 / (D * gamma)),
    }
    state = sp.Placement.initial("a", 4)
    for i in range(4):
        state = state.add(i, "b")
    het = sp.speedup(state, devices, sp.Workload(D, 4, 1))
    assert het == pytest.approx(sp.speedup_homogeneous([2] * 4, gamma))
