"""An overload drop refuses a stage whose layers a replicated layer run (module scaling)
covers: the run's holders index the stage's layers and pages (issues 13 and 15 meet here)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from tessera_agent import overload_shift
from tessera_agent.engine import errors


def _hosted(runs: list[Any]) -> Any:
    return SimpleNamespace(holder="r0/0", stage=SimpleNamespace(runner=SimpleNamespace(runs=runs)))


def test_a_stage_without_layer_runs_may_drop() -> None:
    overload_shift._no_layer_runs(cast(Any, _hosted([])))


def test_a_stage_with_a_layer_run_refuses_the_drop_with_the_reason() -> None:
    run = SimpleNamespace(start=2, end=4)
    with pytest.raises(errors.FailedPreconditionError, match=r"layer runs \[2, 4\).*evict"):
        overload_shift._no_layer_runs(cast(Any, _hosted([run])))
