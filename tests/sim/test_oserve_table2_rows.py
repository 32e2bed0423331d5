"""Table 2's rows for chosen traces, with each run's P99 per span (simulation)."""

from __future__ import annotations

import pytest

from tessera.planner import bench as planner_bench
from tessera.planner import table1
from tessera.sim import oserve_table2
from tessera.sim.bench import TRACE, profile_of
from tessera.workload import traces


@pytest.mark.slow
def test_one_trace_alone_with_its_p99_per_span() -> None:
    prof = profile_of("llama-2-70b")
    base = table1.quadrant_classes(traces.read_trace(str(TRACE)))
    with pytest.raises(ValueError, match="T9"):
        oserve_table2.table2_rows(prof, base, planner_bench.SLO, True, only=("T9",))
    rows = oserve_table2.table2_rows(prof, base, planner_bench.SLO, True, only=("T1",))
    assert [r["trace"] for r in rows] == ["T1"]
    row = rows[0]
    run = row["switching_transition_raw"]
    # quick: 3 phases of 3 spans of 30 s; the first span is not scored
    assert len(row["static"]["p99_by_span_s"]) == len(run["p99_by_span_s"]) == 8
    # the run's P99 lies within its spans' P99s
    spans = [x for x in run["p99_by_span_s"] if x is not None]
    assert min(spans) <= run["p99_latency_s"] <= max(spans)
