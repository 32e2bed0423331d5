"""Guarded parts of `tessera bench gpu`: a failure or a spent time budget is a string.

`Parts.run(key, fn)` runs one named part of the GPU check; an exception, or a call past
the budget, records a string under `errors[key]` instead of stopping the run. Used by
`bench_gpu.run` (the whole check) and `bench_gpu_shape.shape_figures` (one shape's parts).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class Parts:
    """Runs named parts of the check, each guarded: a failure or an exhausted time budget
    records a string under `errors`, never stops the run."""

    def __init__(self, budget_s: float) -> None:
        self.t0, self.budget_s = time.monotonic(), budget_s
        self.errors: dict[str, str] = {}

    def run(self, key: str, fn: Callable[[], Any]) -> Any:
        if time.monotonic() - self.t0 > self.budget_s:
            self.errors[key] = f"skipped: past the {self.budget_s:.0f} s budget"
            return None
        try:
            return fn()
        except Exception as exc:
            self.errors[key] = f"{type(exc).__name__}: {exc}"[:400]
            return None
