"""Where a via-operator on run's slowest requests waited: each against the loop's shifts.

Input: the loop's acting ticks as `Shift`s (start and end s from the replay's start, drops,
restores; from the operator's `OverloadShifted` events: end = the event's time, start =
end less the steps' times its message names) and each request's arrival and TTFT.
`slowest` gives the slowest 1 % (at least 3: p99 of 160 is the third) as
[arrival s, TTFT ms, phase]; phases: `before-drop` (arrived before the first drop ended),
`drop-steps` (arrived while a drop's steps ran), `re-drop` (arrived after a restore and
waited through a drop after it), `after-restore` (arrived after a restore, no drop since),
`dropped` (arrived while the groups were dropped). Caller: `bench_overload_operator`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Shift:
    start: float
    end: float
    drops: int
    restores: int


def shift(message: str, end: float) -> Shift:
    """A `Shift` from an `OverloadShifted` message posted at `end` (s from the start)."""

    def num(pattern: str) -> float:
        m = re.search(pattern, message)
        return float(m.group(1)) if m else 0.0

    took = sum(num(rf"{k} ([0-9.]+) ms") for k in ("exchange", "paused", "routes", "drain"))
    drops, restores = int(num(r"([0-9]+) drops")), int(num(r"([0-9]+) restores"))
    return Shift(round(max(0.0, end - took / 1e3), 3), round(end, 3), drops, restores)


def phase(shifts: Sequence[Shift], arrival: float, ttft: float) -> str:
    """The phase (module docstring) of a request arriving at `arrival` s, first token
    `ttft` s later."""
    drops = [s for s in shifts if s.drops]
    if not drops or arrival < drops[0].end:
        return "drop-steps" if drops and arrival >= drops[0].start else "before-drop"
    if any(s.start <= arrival < s.end for s in drops):
        return "drop-steps"
    restored = [s for s in shifts if s.restores and s.end <= arrival]
    if not restored:
        return "dropped"
    after = restored[-1].end
    if any(after < s.end <= arrival for s in drops):
        return "dropped"
    if any(after <= s.start < arrival + ttft for s in drops):
        return "re-drop"
    return "after-restore"


def slowest(
    shifts: Sequence[Shift], arrivals: Sequence[float], ttfts: Sequence[float | None]
) -> list[list[float | str]]:
    """The slowest 1 % (at least 3) as [arrival s, TTFT ms, phase], slowest first."""
    pairs = sorted(
        ((t, a) for a, t in zip(arrivals, ttfts, strict=True) if t is not None), reverse=True
    )
    k = max(3, math.ceil(len(arrivals) / 100))
    return [[round(a, 2), round(t * 1e3, 1), phase(shifts, a, t)] for t, a in pairs[:k]]
