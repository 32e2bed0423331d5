"""`tessera bench autoscale --tiny` (issue 32): both runs of the trace replay through
`tessera up` complete every request and report p99 TTFT and replica-seconds."""

from __future__ import annotations

import argparse

import pytest

from tessera.cli import bench_autoscale

pytestmark = pytest.mark.slow


def test_tiny_autoscale_bench() -> None:
    p = argparse.ArgumentParser()
    bench_autoscale.add_arguments(p)
    args = p.parse_args(["--tiny"])
    out = bench_autoscale.run(args)
    assert out["lost_autoscale"] == 0 and out["lost_fixed"] == 0, out["failures"]
    assert out["p99_ttft_ms_autoscale"] > 0 and out["p99_ttft_ms_fixed"] > 0
    assert out["replica_seconds_autoscale"] > 0 and out["replica_seconds_fixed"] > 0
    assert 1 <= out["fixed_replicas"] <= 2
