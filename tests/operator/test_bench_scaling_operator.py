"""`tessera bench scaling --via operator` (issue 30): the keys of the `tessera up` path, and an
op table of what the operator's loop applied (replicate, evict, migrate), every request served.

Runs `bench_scaling.run` with tiny settings: two agent processes, KMock, the operator and a
gateway in this process (`cli/bench_operator_harness.py`).
"""

from __future__ import annotations

import argparse

import pytest

from tessera.cli import bench_scaling

pytestmark = pytest.mark.slow

UP_KEYS = {
    "bench", "via", "date", "machine", "cpus", "model", "op_table",
    "throughput_ratio_by_load", "p99_ratio_by_load", "runs", "wall_s", "caveat",
}  # fmt: skip
ROW_KEYS = {
    "op", "layers", "seconds", "pause_ms", "param_bytes", "kv_bytes", "kv_pages",
    "requests_moved",
}  # fmt: skip


def test_bench_scaling_via_operator_reports_the_up_keys_and_the_loops_ops() -> None:
    p = argparse.ArgumentParser()
    bench_scaling.add_arguments(p)
    argv = "--via operator --loads 8 --requests 3 --tokens 8 --migrate-wait-s 15"
    args = p.parse_args(argv.split())
    out = bench_scaling.run(args)
    assert UP_KEYS <= set(out) and out["via"] == "operator"
    assert out["lost"] == 0
    assert all(set(row) == ROW_KEYS for row in out["op_table"])
    ops = {row["op"] for row in out["op_table"]}
    assert {"replicate", "evict", "migrate"} <= ops
    placed = [r for r in out["runs"] if r["policy"] == "on"]
    assert placed and all(r["replicated"] for r in placed)
    for row in out["op_table"]:
        if row["seconds"] is not None:
            assert row["seconds"] > 0 and row["layers"] >= 1
    if not out["migrate_reason"].startswith("the loop migrated"):  # null row, with the reason
        assert any(r["op"] == "migrate" and r["seconds"] is None for r in out["op_table"])
