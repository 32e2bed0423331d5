"""The simulator's control plane: the KunServe overload loop drops parameters into
pipelines during a burst and cuts the tail TTFT (a simulation)."""

from __future__ import annotations

from tessera.sim import bench


def test_kunserve_burst_drops_and_lowers_p99_ttft() -> None:
    rows = bench.kunserve_burst(quick=True)
    base, drop, ratio = rows
    assert base["mode"] == "kv_centric" and drop["mode"] == "parameter_drop"
    assert base["drops"] == 0 and drop["drops"] >= 1
    assert drop["ttft_p99_s"] < base["ttft_p99_s"]
    assert ratio["p99_ttft_reduction"] > 1.5
