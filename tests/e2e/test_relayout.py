"""Live layout transitions of `tessera up` under steady load, by changing its manifest.

One lean run of `tessera bench relayout` (tiny model, few requests): 2 whole replicas →
1 whole + a 2-stage pipeline → the pipeline split at other layers → back. Every request
completes with transformers' greedy text, each transition ends with the old blocks freed,
and the long requests decoding on the replica that leaves continue on another one (their
KV moved: the drain deadline is too short for them to finish there).
"""

from __future__ import annotations

import argparse

import pytest

from tessera.cli import bench_relayout

pytestmark = pytest.mark.slow


def test_transitions_under_load_lose_nothing_and_match_transformers() -> None:
    parser = argparse.ArgumentParser()
    bench_relayout.add_arguments(parser)
    args = parser.parse_args(
        [
            "--requests",
            "16",
            "--time-scale",
            "2",
            "--long-tokens",
            "64",
            "--drain-deadline",
            "0.2",
            "--max-output",
            "16",
        ]
    )
    out = bench_relayout.run(args)
    assert out["requests_sent"] == 16 + 3 * 2
    assert out["lost"] == 0, out["lost_examples"]
    assert out["requests_completed"] == out["requests_sent"]
    assert out["tokens_match"] and out["tokens_compared"] == out["requests_sent"]
    assert out["transitions"] == [name for name, _ in bench_relayout.LAYOUTS[1:]] + [
        bench_relayout.LAYOUTS[0][0]
    ]
    assert len(out["transition_s"]) == 3
    # a request whose replica was removed mid-decode continued on another one
    assert out["cutover_requests"].get("moved", 0) >= 1, out["cutover_requests"]
