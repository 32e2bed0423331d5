"""The benchmark harness: percentiles, per-round ratios, interleaving, provenance."""

from __future__ import annotations

import math

from tessera.bench import harness


def test_pct_is_nearest_rank_and_nan_when_empty() -> None:
    assert harness.pct([3.0, 1.0, 2.0], 50) == 2.0
    assert harness.pct([1.0, 2.0, 3.0, 4.0], 99) == 4.0
    assert math.isnan(harness.pct([], 50))


def test_median_ratio_is_the_median_of_per_round_ratios() -> None:
    # ratio of medians would be 2/1 = 2.0; the per-round ratios are 4, 1, 1.5
    assert harness.median_ratio([4.0, 2.0, 3.0], [1.0, 2.0, 2.0]) == 1.5


def test_interleave_alternates_modes_round_by_round() -> None:
    calls: list[tuple[str, int]] = []

    def one(mode: str, k: int) -> str:
        calls.append((mode, k))
        return f"{mode}{k}"

    out = harness.interleave(["a", "b"], 2, one)
    assert calls == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert out == {"a": ["a0", "a1"], "b": ["b0", "b1"]}


def test_timed_rounds_warms_up_then_times_each_in_turn() -> None:
    calls: list[str] = []
    outs, times = harness.timed_rounds(
        [lambda: calls.append("x") or 1, lambda: calls.append("y") or 2], 3
    )
    assert calls == ["x", "y"] * 4  # one warm-up round, three timed
    assert outs == [1, 2] and [len(t) for t in times] == [3, 3]


def test_provenance_names_machine_commit_and_date() -> None:
    p = harness.provenance()
    assert p["commit"] and p["machine"] and p["date"][:2] == "20"
    assert isinstance(p["quiet"], bool)
