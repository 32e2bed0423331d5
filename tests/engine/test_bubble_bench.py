"""`tessera bench overload`'s live bubble phase (issue 13): both splits run on one 2-stage
pipeline, each stage's busy time is measured, and the tokens are transformers'."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.cli import bench_overload_bubble
from tests.conftest import hf_greedy


def test_live_bubble_of_both_splits(tiny_llama: Path, prompts: list[list[int]]) -> None:
    news = [4] * 6
    res = bench_overload_bubble.measure(tiny_llama, prompts[:6], news, rounds=2, min_tokens=4)
    for key in ("bubble_fraction_lookahead", "bubble_fraction_token_count"):
        assert 0.0 <= res[key] < 1.0
    assert res["bubble_microbatches"]["lookahead"].get("lookahead", 0) > 0
    assert res["bubble_microbatches"]["token_count"].get("token_count", 0) > 0
    assert res["bubble_tokens_equal"]
    assert res["bubble_tokens"] == [hf_greedy(tiny_llama, p, 4) for p in prompts[:6]]


def test_the_bubble_flags_take_a_positive_count() -> None:
    """`--bubble-rounds 0` used to end in a StatisticsError traceback after the setup."""
    import argparse

    from tessera.cli import bench_overload

    parser = argparse.ArgumentParser()
    bench_overload.add_arguments(parser)
    assert parser.parse_args(["--bubble-rounds", "1"]).bubble_rounds == 1
    for flag in ("--bubble-rounds", "--bubble-requests"):
        for bad in ("0", "-1", "x"):
            with pytest.raises(SystemExit):
                parser.parse_args([flag, bad])
