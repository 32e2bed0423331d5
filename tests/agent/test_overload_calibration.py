"""`tessera bench overload`'s calibration (issue 30): 4 agent processes with whole replicas
of the bench's 6-page pool complete every sampled request in full, and the capacity is the
requests over the measured wall time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.cli import bench_overload_scenario as scenario

pytestmark = pytest.mark.slow


def test_calibration_completes_the_sample_on_four_whole_replicas(tiny_llama: Path) -> None:
    rows = [(float(t), 10 + t % 30, 2 + t % 5) for t in range(40)]
    from tessera_agent.engine import config, kv_cache

    cfg = config.ModelConfig.from_path(tiny_llama)
    kv = 6 * kv_cache.KVLayout(8, 1, 16, cfg.num_kv_heads, cfg.head_dim).bytes_per_page
    cap = scenario.calibrate(tiny_llama, rows, kv, 8, seed=0)
    want = scenario.sample(rows, 8, seed=0)
    assert cap.requests == 8
    assert cap.tokens == sum(o for _, o in want)  # every request ran to its max_tokens
    assert 0 < cap.wall_s < 120
    assert cap.requests_per_s == pytest.approx(8 / cap.wall_s)
