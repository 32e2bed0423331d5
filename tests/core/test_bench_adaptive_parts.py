"""Pieces of `tessera bench adaptive` without servers: the shifting-mix replay built from a
trace, the calibrated price, and the forecast report."""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

import pytest

from tessera.cli import bench_adaptive, bench_adaptive_replay


def _args(tmp_path: Path) -> argparse.Namespace:
    trace = tmp_path / "t.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(200):
        inp, out = (100, 20) if i % 3 else (3000, 200)
        rows.append(f"2023-11-16 18:{i // 60:02d}:{i % 60:02d}.0000000,{inp + i},{out}")
    trace.write_text("\n".join(rows) + "\n")
    return argparse.Namespace(
        trace=trace, input_scale=0.1, output_scale=0.1, max_input=256, max_output=48,
        seed=0, rate=2.0, span=4.0, phase_spans=2, low_share=0.1, high_share=0.9,
    )  # fmt: skip


def test_replay_mix_shifts_by_phase_and_draws_without_reuse(tmp_path: Path) -> None:
    args = _args(tmp_path)
    w = bench_adaptive_replay.Workload(args)
    assert w.centroids[0][0] < w.centroids[1][0]  # "short" prompts first
    shares = bench_adaptive_replay.phase_shares(args, 6)
    assert shares == [0.1, 0.1, 0.9, 0.9, 0.1, 0.1]
    reqs = bench_adaptive_replay.make_spans(w, [0.0, 1.0], args, random.Random(0))
    per_span = [[r for r in reqs if k * 4.0 <= r.at < (k + 1) * 4.0] for k in range(2)]
    assert [len(s) for s in per_span] == [8, 8]
    assert {r.cls for r in per_span[0]} == {0} and {r.cls for r in per_span[1]} == {1}
    assert all(len(r.prompt) > 100 for r in per_span[1])  # long prompts (scaled 300+)
    assert w.used == [8, 8]  # each drawn once, in trace order


def test_calibrated_price_interpolates_in_the_long_share() -> None:
    cal = bench_adaptive.Calibration({0: (1.0, 3.0), 1: (2.0, 2.0)}, 0.1, 0.9, 0.5)
    assert cal.price("0", (9.0, 1.0)) == pytest.approx(1.0)
    assert cal.price("0", (1.0, 1.0)) == pytest.approx(2.0)  # share 0.5: halfway
    assert cal.price("0", (0.0, 5.0)) == pytest.approx(3.0)  # clamped past the high share
    assert cal.price("1", (1.0, 1.0)) == pytest.approx(2.0)
    assert math.isinf(bench_adaptive.Calibration({0: (math.nan, 1.0)}, 0.1, 0.9, 0).price(
        "0", (9.0, 1.0)
    ))  # fmt: skip


def test_forecast_report_scores_each_method_and_the_selection() -> None:
    history = [[10.0, 0.0], [0.0, 10.0]] * 4
    log = bench_adaptive.LoopLog([], {5: (10.0, 0.0), 6: (0.0, 10.0)}, [], first_span=3)
    got = bench_adaptive.forecast_quality(history, log)
    assert got["spans"] == 8 and got["last_value"] > 1.0
    # seasonal finds the period once 3 periods are seen (spans 6, 7 exact)
    assert got["seasonal"] < got["last_value"]
    # the loop forecast spans 5 and 6 (rows 2 and 3: [10, 0], [0, 10]) exactly
    assert got["selected"] == pytest.approx(0.0)
    assert bench_adaptive.forecast_quality(history[:3], log) == {"spans": 3}
