"""A switch on local agents whose memory is full (issue 34): one 2-stage replica over
both agents, each agent's KV pool taking the memory its stage's parameters leave, so
make-before-break has no room and no second replica serves while one is freed (the
planner ended this InsufficientMemory before pools could shrink). Under load, the
switch and the switch back complete: nothing lost, greedy text equals transformers',
and the extra memory at the peak stays below the incoming layout's parameters."""

from __future__ import annotations

import argparse

import pytest

from tessera.cli import bench_relayout_full

pytestmark = pytest.mark.slow


def test_full_memory_switch_completes_under_load() -> None:
    parser = argparse.ArgumentParser()
    bench_relayout_full.add_arguments(parser)
    args = parser.parse_args(
        ["--requests", "16", "--time-scale", "2", "--max-output", "16", "--drain-deadline", "2"]
    )
    out = bench_relayout_full.run(args)
    assert out["lost"] == 0, out["lost_examples"]
    assert out["requests_completed"] == out["requests_sent"] == 16
    assert out["tokens_match"] and out["tokens_compared"] == 16
    assert out["transitions"] == [
        bench_relayout_full.LAYOUTS[1][0],
        bench_relayout_full.LAYOUTS[0][0],
    ]
    for extra, incoming in zip(
        out["extra_bytes_per_transition"], out["incoming_param_bytes"], strict=True
    ):
        assert extra <= incoming, out


def test_drop_style_switch_completes_under_load() -> None:
    """Two whole replicas at full memory switch to one replica whose stages do not fit
    beside a whole replica even with its pool empty (InsufficientMemory before drops):
    the whole replicas drop replicated layers into one pipeline, its grown pools shrink,
    the new replica loads, nothing is lost and the text equals transformers'."""
    parser = argparse.ArgumentParser()
    bench_relayout_full.add_arguments(parser)
    args = parser.parse_args(
        [
            "--scenario",
            "drop",
            "--requests",
            "16",
            "--time-scale",
            "2",
            "--max-output",
            "16",
            "--drain-deadline",
            "2",
        ]
    )
    out = bench_relayout_full.run(args)
    assert out["lost"] == 0, out["lost_examples"]
    assert out["requests_completed"] == out["requests_sent"] == 16
    assert out["tokens_match"] and out["tokens_compared"] == 16
    assert out["transition_modes"][:2] == ["drop-layers", "shrink-pools"], out
    assert out["extra_bytes_peak"] <= out["incoming_param_bytes"][0], out
