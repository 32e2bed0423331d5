"""`tessera bench wake --tiny` (issue 32): scale from zero and back with nothing lost, a wake
restored from the host cache, and every figure the acceptance names present."""

from __future__ import annotations

import argparse

import pytest

from tessera.cli import bench_wake

pytestmark = pytest.mark.slow


def test_tiny_wake_bench() -> None:
    p = argparse.ArgumentParser()
    bench_wake.add_arguments(p)
    out = bench_wake.run(p.parse_args(["--tiny", "--rounds", "1", "--requests", "3"]))
    assert out["lost"] == 0 and out["tokens_match"] and out["requests_from_zero"] == 3
    assert out["restored_bytes"] > 0 and out["wake_s"] > 0 and out["ready_s_storage"] > 0
    assert out["first_token_s_from_zero"] > 0
