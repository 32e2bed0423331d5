"""The via-operator bench's phase of each slow request against the loop's shifts."""

from __future__ import annotations

from tessera.cli import bench_overload_timeline as tl

MSG = (
    "2 drops, 0 restores: exchange 10.0 ms, paused 20.0 ms, drop routes 50.0 ms, drop drain 20.0 ms"
)


def test_shift_start_is_the_event_less_the_steps() -> None:
    s = tl.shift(MSG, 2.0)
    assert (s.start, s.end, s.drops, s.restores) == (1.9, 2.0, 2, 0)
    r = tl.shift("0 drops, 1 restores: exchange 5.0 ms, paused 5.0 ms", 6.0)
    assert (r.start, r.end, r.drops, r.restores) == (5.99, 6.0, 0, 1)


SHIFTS = [
    tl.Shift(1.0, 1.2, 2, 0),
    tl.Shift(3.0, 3.1, 0, 1),
    tl.Shift(4.0, 4.3, 1, 0),
    tl.Shift(8.0, 8.1, 0, 2),
]


def test_phases() -> None:
    assert tl.phase(SHIFTS, 0.5, 0.2) == "before-drop"
    assert tl.phase(SHIFTS, 1.1, 0.2) == "drop-steps"
    assert tl.phase(SHIFTS, 2.0, 0.2) == "dropped"
    assert tl.phase(SHIFTS, 3.5, 0.2) == "after-restore"
    assert tl.phase(SHIFTS, 3.5, 0.8) == "re-drop"  # waited through the drop at 4.0
    assert tl.phase(SHIFTS, 4.1, 0.5) == "drop-steps"
    assert tl.phase(SHIFTS, 5.0, 0.5) == "dropped"
    assert tl.phase(SHIFTS, 9.0, 0.5) == "after-restore"
    assert tl.phase([], 9.0, 0.5) == "before-drop"


def test_slowest_is_one_percent_at_least_three() -> None:
    arrivals = [i * 0.05 for i in range(400)]
    ttfts: list[float | None] = [0.01 * (i % 7) for i in range(400)]
    ttfts[10] = 2.0
    ttfts[11] = None
    out = tl.slowest(SHIFTS, arrivals, ttfts)
    assert len(out) == 4
    assert out[0] == [0.5, 2000.0, "before-drop"]
    assert tl.slowest(SHIFTS, arrivals[:50], ttfts[:50])[2][1] == 60.0
