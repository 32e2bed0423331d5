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
