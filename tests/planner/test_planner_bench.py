"""The planner benchmark's contract: exact field names, analytic labelling, a plot."""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

import pytest

from tessera.planner import bench


def _trace(path: Path, rows: int = 240) -> Path:
    rng = random.Random(0)
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for i in range(rows):
            kind = i % 3
            inp = [rng.randint(150, 400), rng.randint(900, 1300), rng.randint(2000, 2600)][kind]
            gen = [rng.randint(20, 120), rng.randint(300, 500), rng.randint(40, 100)][kind]
            out.writerow([f"2023-11-16 18:15:{i % 60:02d}.{i:07d}", inp, gen])
    return path


@pytest.mark.slow
def test_quick_bench_fields_and_plot(tmp_path: Path) -> None:
    trace = str(_trace(tmp_path / "trace.csv"))
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    plot = tmp_path / "skew.png"
    result = bench.run(parser.parse_args(["--quick", "--plot", str(plot), "--trace", trace]))
    for key in (
        "heuristic_vs_exhaustive_min",
        "heuristic_vs_exhaustive_mean",
        "hetero_vs_homo_mean",
        "exhaustive_s_16",
        "heuristic_s_16",
        "plan_s_64",
        "plan_s_256",
        "plan_s_1024",
    ):
        assert isinstance(result[key], float), key
    assert result["profile_source"] == "analytic" and "simulated" in result["note"]
    assert result["heuristic_vs_exhaustive_min"] >= 0.99
    assert result["hetero_vs_homo_mean"] >= 1.0 - 1e-9
    assert plot.stat().st_size > 1000
    table = result["oserve_table1"]
    assert "model output" in table["label"] and "not measured" in table["label"]
    assert [r["level"] for r in table["rows"]] == ["S1", "S5"]
    for row in table["rows"]:
        assert row["cv"] == pytest.approx(row["paper_cv"], abs=6e-4)
        assert row["speedup"] >= 1.0 - 1e-9  # the heterogeneous search includes homogeneous
    (switch,) = table["switch_plans"]
    assert switch["plan_vs_bound"] >= 1.0 - 1e-6 and switch["switch_s"] < switch["reload_s"]


def test_help_line_and_compositions() -> None:
    assert (bench.__doc__ or "").strip().splitlines()[0].startswith("Planner benchmark")
    mixes = bench.compositions(3, (0.0, 0.5))
    assert len(mixes) == 4
    for _, _, weights in mixes:
        assert sum(weights) == pytest.approx(1.0)
