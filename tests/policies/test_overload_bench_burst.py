"""The overload bench's burst: the arrival rate doubles inside the window, nowhere else."""

from __future__ import annotations

import itertools

from tessera.cli import bench_overload


def test_burst_halves_gaps_inside_the_window_only() -> None:
    reqs = [(float(t), 10, 5) for t in range(0, 20, 2)]  # one request every 2 s, 10 of them
    out = bench_overload.burst(reqs, 0.3, 0.7)  # requests 3..6 form the window
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(out)]
    assert gaps == [2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    assert [r[1:] for r in out] == [r[1:] for r in reqs]  # sizes unchanged


def test_via_operator_counts_shifts_from_the_loop_events() -> None:
    """Drops and restores via the operator come from `OverloadShifted` (one per acting
    tick), not from the status events, which repeat when two passes see a stale status."""
    from tessera.cli import bench_overload_operator as via

    msg = "1 drops, 2 restores: exchange 5.2 ms, paused 47.3 ms"
    assert (via._count(msg, "drops"), via._count(msg, "restores")) == (1, 2)
    assert (via._ms(msg, "exchange"), via._ms(msg, "paused")) == (5.2, 47.3)
