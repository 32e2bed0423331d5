"""The executor's `DropLayers` (issue 34): it drives exactly KunServe's drop steps for the
group the action names (`overload_steps.drop_steps`) through the overload driver, and a
driver failure is a failed step (the transition stops behind it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from tessera import observed
from tessera.control import actuate, overload_driver
from tessera.policies.overload import drop_plan
from tessera.policies.overload import steps as overload_steps
from tessera.policies.transition import actions
from tessera.policies.transition import planner as transition

DROP = actions.DropLayers(
    (
        actions.DropStage("r0", "a", "a:1", 0, 4),
        actions.DropStage("r1", "b", "b:1", 4, 8),
    )
)


class FakeDriver:
    ran: ClassVar[list[tuple[Any, ...]]] = []
    fail = False

    def __init__(self, **_: Any) -> None:
        pass

    async def run(self, steps: Sequence[Any]) -> overload_driver.Report:
        FakeDriver.ran.append(tuple(steps))
        if FakeDriver.fail:
            raise overload_driver.DriveError("drop r1: FAILED_PRECONDITION")
        return overload_driver.Report(paused_s=0.01, exchanged_pages=3)

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("fail", [False, True])
async def test_drop_layers_runs_the_drop_steps(monkeypatch: pytest.MonkeyPatch, fail: bool) -> None:
    monkeypatch.setattr(overload_driver, "Driver", FakeDriver)
    FakeDriver.ran, FakeDriver.fail = [], fail
    t = transition.Transition(1, (actions.Step(0, DROP),), "drop-layers")
    world = transition.World(observed.Observed(), "")

    async def publish(_: actions.CutOver) -> None:
        raise AssertionError("a drop publishes nothing")

    (res,) = await actuate.execute(t, world, publish, tls=None)
    group = drop_plan.Group(
        ("r0", "r1"), (drop_plan.Stage("r0", 0, 4), drop_plan.Stage("r1", 4, 8)), 0, True
    )
    members = {
        "r0": overload_steps.Member("r0", "a:1"),
        "r1": overload_steps.Member("r1", "b:1"),
    }
    assert FakeDriver.ran == [overload_steps.drop_steps(group, members)]
    assert res.ok is not fail and res.step == 0
    if fail:
        assert res.code == "DROP_FAILED" and "FAILED_PRECONDITION" in res.message
    else:
        assert "3 pages exchanged" in res.message
