"""The overload bench's burst: the arrival rate doubles inside the window, nowhere else."""

from __future__ import annotations

import itertools
from pathlib import Path

from tessera.cli import bench_overload, bench_overload_scenario


def test_burst_halves_gaps_inside_the_window_only() -> None:
    reqs = [(float(t), 10, 5) for t in range(0, 20, 2)]  # one request every 2 s, 10 of them
    out = bench_overload_scenario.burst(reqs, 0.3, 0.7)  # requests 3..6 form the window
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


def test_the_time_scale_puts_the_burst_at_the_asked_multiple_of_capacity() -> None:
    from tessera.cli import bench_overload_scenario as scenario

    reqs = [(float(t), 10, 5) for t in range(0, 20, 2)]  # 0.5 requests/s at scale 1
    out = bench_overload_scenario.burst(reqs, 0.3, 0.7)
    assert scenario.window_rate(out, 0.3, 0.7) == 1.0  # 3 gaps of 1 s inside the window
    scale = scenario.time_scale_for(out, 1.0, 0.3, 0.7, capacity_rps=5.0, multiple=4.0)
    assert scale == 20.0
    # the rows at that scale: the window arrives at 20 requests/s = 4 x 5
    scaled = [(t / scale, ci, co) for t, ci, co in out]
    assert abs(scenario.window_rate(scaled, 0.3, 0.7) - 20.0) < 1e-9
    # loaded at another scale, the same answer
    at2 = [(t / 2, ci, co) for t, ci, co in out]
    assert abs(scenario.time_scale_for(at2, 2.0, 0.3, 0.7, 5.0, 4.0) - 20.0) < 1e-9
    # a faster deployment gets a proportionally faster replay
    assert scenario.time_scale_for(out, 1.0, 0.3, 0.7, 10.0, 4.0) == 40.0


def test_the_calibration_sample_follows_the_replay_mix_with_fresh_prompts() -> None:
    from tessera.cli import bench_overload_scenario as scenario

    reqs = [(float(t), 3 + t % 5, 1 + t % 7) for t in range(40)]
    got = scenario.sample(reqs, 8, seed=0)
    assert [(len(p), o) for p, o in got] == [(r[1], r[2]) for r in reqs[::5]]
    assert all(p[0] == 0 and all(5 <= x < 500 for x in p[1:]) for p, _ in got)


def test_slowest_names_the_requests_that_make_p99() -> None:
    from tessera.cli import bench_overload_scenario as scenario

    got = scenario.slowest([0.0, 1.0, 2.0, 3.0], [0.1, None, 0.5, 0.3], k=2)
    assert got == [[2.0, 500.0], [3.0, 300.0]]


def test_time_scale_given_wins_and_the_default_is_calibrated() -> None:
    import argparse

    from tessera.cli import bench_overload_scenario as scenario

    parser = argparse.ArgumentParser()
    bench_overload.add_arguments(parser)
    args = parser.parse_args([])
    assert args.time_scale is None and args.overload_multiple == scenario.DEFAULT_MULTIPLE
    args = parser.parse_args(["--time-scale", "8"])
    seen: list[float] = []

    def rows_at(scale: float) -> list[tuple[float, int, int]]:
        seen.append(scale)
        return bench_overload_scenario.burst(
            [(t / scale, 10, 5) for t in range(0, 40, 2)], *args.burst
        )

    reqs, keys = scenario.choose(args, Path("unused"), 1, rows_at)  # no calibration
    assert seen == [8.0] and keys["time_scale"] == 8.0 and keys["calibration"] is None
    assert keys["burst_rate_rps"] == 8.0  # the window's gaps: 2 s / 2 / 8
    assert reqs == rows_at(8.0)


def test_the_drops_waits_reach_the_bench_output() -> None:
    """The loop's `OverloadShifted` text names how long the drops waited for the gateway
    and for the donors' drain; the bench reads both back."""
    from tessera.cli import bench_overload_operator as via
    from tessera.control import overload as control

    out = control.Tick(drops=1, restores=1, exchange_s=0.0052, paused_s=0.0473)
    out.drop_step_s.update(Routes=0.2065, Drain=1.0873, Pause=0.001)
    msg = control.shifted_message(out)
    assert (via._count(msg, "drops"), via._count(msg, "restores")) == (1, 1)
    assert (via._ms(msg, "exchange"), via._ms(msg, "paused")) == (5.2, 47.3)
    assert (via._ms(msg, "drop routes"), via._ms(msg, "drop drain")) == (206.5, 1087.3)
    no_drop = control.shifted_message(control.Tick(restores=1))
    assert via._ms(no_drop, "drop routes") == 0.0
