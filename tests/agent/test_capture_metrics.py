"""The agent reports a CUDA stage's graph capture (seconds, pool bytes) in its metrics;
stages without graphs report none. Read through the collector with a fake agent state."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tessera_agent import metrics


def _hosted(graphs: Any) -> Any:
    runner = SimpleNamespace(decode_graph=None, graphs=graphs, split_steps=0)
    stage = SimpleNamespace(param_bytes=10, kv_bytes=20, runner=runner)
    return SimpleNamespace(stage=stage, leader=None, compile_status="warm")


def test_capture_seconds_and_pool_bytes_per_stage() -> None:
    graphs = SimpleNamespace(capture_s=2.5, pool_bytes=3 << 20, buckets={(1, 256): None})
    state = SimpleNamespace(
        agent_id="a",
        devices={},
        hosted={("r0", 0): _hosted(graphs), ("r1", 0): _hosted(None)},
        compute=None,
    )
    got = {
        (m.name, tuple(sorted(s.labels.items()))): s.value
        for m in metrics._StateCollector(state).collect()  # type: ignore[arg-type]
        for s in m.samples
    }
    key = (("replica", "r0"), ("stage", "0"))
    assert got[("tessera_agent_cuda_graph_capture_seconds", key)] == 2.5
    assert got[("tessera_agent_cuda_graph_pool_bytes", key)] == 3 << 20
    assert not any(k[1][0] == ("replica", "r1") for k in got if "cuda_graph" in k[0])
