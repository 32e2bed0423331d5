"""`tessera sim` end to end on a small manifest: the real planner, a short Poisson run,
JSON summary and plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_sim_cli_json_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "sim",
            "-f",
            str(ROOT / "examples/planner/llama2-13b-h100.yaml"),
            "--cluster",
            str(ROOT / "examples/clusters/2x8-h100.yaml"),
            "--poisson",
            "10",
            "--duration",
            "20",
            "--json",
            "--plots",
            str(tmp_path),
            "--policies",
            "overload",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["simulated"] is True and "simulation" in out["note"]
    assert out["requests"] > 100 and out["unfinished"] == 0
    assert out["gpus"] == 16
    assert 0 < out["ttft_p50_s"] <= out["ttft_p99_s"]
    assert sorted(Path(p).name for p in out["plots"]) == [
        "deployment.png",
        "latency.png",
        "memory.png",
    ]


def test_sim_cli_rejects_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "sim",
            "-f",
            str(ROOT / "examples/planner/llama2-13b-h100.yaml"),
            "--cluster",
            str(ROOT / "examples/clusters/2x8-h100.yaml"),
            "--poisson",
            "1",
            "--policies",
            "nope",
        ]
    )
    assert code == 2
    assert "unknown" in capsys.readouterr().err
