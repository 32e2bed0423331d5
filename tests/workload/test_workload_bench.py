"""Predictor benchmark: runs on a small Azure-format trace, deterministic apart from timings."""

from __future__ import annotations

import argparse
import datetime
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tessera.workload import bench

TIMING = ("train_s", "predict_ms")
REQUIRED = (
    "rrmse_lstm",
    "rrmse_moving_average",
    "rrmse_last_value",
    "rrmse_exp_smoothing",
    "classes",
    "per_class",
    "span_s",
    "train_s",
    "predict_ms",
    "trace",
    "requests",
    "seed",
    "spans_train",
    "spans_test",
)


def _azure_trace(path: Path, seconds: int = 400, seed: int = 0) -> Path:
    """A periodic-rate Azure-format trace with two request shapes."""
    rng = np.random.default_rng(seed)
    start = datetime.datetime(2023, 11, 16, 18, 0, 0)
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for second in range(seconds):
        rate = 1.5 + np.sin(2 * np.pi * second / 40)
        for _ in range(rng.poisson(rate)):
            at = start + datetime.timedelta(seconds=second + float(rng.random()))
            short = rng.random() < 0.6
            inp = int(rng.lognormal(np.log(200 if short else 2000), 0.2))
            out = int(rng.lognormal(np.log(100 if short else 30), 0.2))
            rows.append(f"{at:%Y-%m-%d %H:%M:%S.%f}0,{inp},{out}")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(argv)


def _small(trace: Path, *extra: str) -> argparse.Namespace:
    base = ["--trace", str(trace), "--span-s", "4", "--window", "10"]
    return _args([*base, "--epochs", "8", "--hidden", "8", *extra])


def test_defaults() -> None:
    args = _args([])
    assert args.span_s == 10.0 and args.window == 50 and args.seed == 0
    assert args.classes is None and args.plot is None
    assert bench.DEFAULT_TRACE.name == "azure_llm_2023_conv.csv"
    assert bench.DEFAULT_TRACE.parent.parent.name == "shared"
    assert (bench.__doc__ or "").splitlines()[0].startswith("Per-class arrival forecasting")


def test_trace_env_is_honoured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`tessera bench` (the entry point) reads $TESSERA_TRACE into --trace's default."""
    from tessera.cli import main as cli

    monkeypatch.setenv(bench.TRACE_ENV, str(tmp_path / "x.csv"))
    parser = cli.build_parser()
    args = parser.parse_args(["bench", "predictor"])
    assert bench.trace_path(args.trace) == tmp_path / "x.csv"
    assert bench.trace_path(Path("given.csv")) == Path("given.csv")
    assert bench.trace_path(None) == bench.DEFAULT_TRACE


def test_run_reports_every_field_and_is_deterministic(tmp_path: Path) -> None:
    trace = _azure_trace(tmp_path / "azure.csv")
    first = bench.run(_small(trace, "--classes", "2", "--plot", str(tmp_path / "p.png")))
    second = bench.run(_small(trace, "--classes", "2"))
    for key in REQUIRED:
        assert key in first
    json.dumps(first, allow_nan=False)
    assert first["classes"] == 2 and len(first["per_class"]) == 2
    assert (first["spans_train"], first["spans_test"]) == (89, 10)  # last arrival at 399.x s
    assert first["span_s"] == 4.0 and first["requests"] > 400
    for key in ("rrmse_lstm", "rrmse_moving_average", "rrmse_last_value", "rrmse_exp_smoothing"):
        assert isinstance(first[key], float) and math.isfinite(first[key]) and first[key] > 0
    assert first["train_s"] > 0 and first["predict_ms"] > 0
    assert (tmp_path / "p.png").stat().st_size > 1000

    def strip(result: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in result.items() if k not in (*TIMING, "plot")}

    assert strip(first) == strip(second)


def test_run_chooses_k_and_rejects_too_short_traces(tmp_path: Path) -> None:
    trace = _azure_trace(tmp_path / "azure.csv", seconds=200)
    result = bench.run(_small(trace))
    assert result["k_criterion"] == "silhouette" and result["classes"] == 2
    with pytest.raises(ValueError, match="do not exceed the LSTM window"):
        bench.run(_args(["--trace", str(trace), "--span-s", "10", "--window", "50"]))
