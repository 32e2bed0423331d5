"""docs/benchmarks.md is generated from docs/bench-results/*.json and says today's figure of
each benchmark, with its command, machine and date, in under 400 lines."""

from __future__ import annotations

import json
from pathlib import Path

from tessera.bench import report
from tessera.cli import bench


def test_benchmarks_md_is_the_rendering_of_the_results_files() -> None:
    want = bench.report_text()
    assert report.DOC.read_text(encoding="utf-8") == want, "run: python -m tessera.cli.bench"
    assert len(want.splitlines()) < 400


def test_every_results_file_names_a_benchmark_and_where_when_how() -> None:
    docs = report.load()
    assert set(docs) <= {*bench.BENCHES, "vllm-anchor"}
    for name, doc in docs.items():
        assert doc["runs"], name
        for run in doc["runs"]:
            assert run["command"] and run["provenance"]["machine"], name
            assert run["provenance"]["date"].startswith("2026-"), name
            assert report.figures(run), name  # something to show


def test_a_recorded_run_becomes_the_current_figure(tmp_path: Path) -> None:
    result = {"speedup": 1.25, "tokens_match": True, "setup": "x", "provenance": {"machine": "m",
              "date": "2026-11-26T07:00:00Z", "commit": "abc", "quiet": True}}  # fmt: skip
    path = report.record("serve", "tessera bench serve --json", result, tmp_path)
    assert json.loads(path.read_text())["runs"][0]["command"] == "tessera bench serve --json"
    text = report.render(report.load(tmp_path), ["serve", "chaos"])
    assert "Not recorded yet: `chaos`." in text
    assert "| `speedup` | 1.25 |" in text and "`setup`" not in text
    assert "2026-11-26T07:00:00Z, `abc`; m, quiet." in text
