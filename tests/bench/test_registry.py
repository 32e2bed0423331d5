"""`tessera bench NAME` is unchanged for users: the same names, the same JSON keys, plus
the provenance every JSON now carries."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types

import pytest

from tessera.cli import bench
from tessera.cli import main as cli

NAMES = {
    "engine", "copy", "tp", "prefix", "kvmove", "serve", "relayout", "switch", "adaptive",
    "planner", "predictor", "reconcile", "chaos", "transition", "sim", "variants", "scaling",
    "overload", "kvdispatch", "prefill", "decode-attn", "speculate", "stitch", "abuse", "gpu",
}  # fmt: skip

# `tessera bench serve --json`'s keys before the harness moved to tessera.bench
SERVE_KEYS = {
    "completed", "failed", "failures", "wall_s", "throughput_tok_s", "generated_tokens",
    "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "requests", "time_scale",
    "trace", "trace_span_s", "transforms", "setup", "machine",
}  # fmt: skip


def test_every_bench_name_is_still_there_and_has_a_module() -> None:
    assert NAMES <= set(bench.BENCHES)  # new benches may come; none of these may go
    for name, module in bench.BENCHES.items():
        assert importlib.util.find_spec(module) is not None, name


def test_the_dispatcher_keeps_a_bench_s_keys_and_adds_provenance(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # unset here, restored after: the dispatcher's default must not leak into other tests
    monkeypatch.delenv("TESSERA_COMPILE_DECODE", raising=False)
    fake = types.ModuleType("fake_bench")
    fake.run = lambda args: {"figure": 1.5, "machine": "m"}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_bench", fake)
    assert bench._runner("fake_bench")(argparse.Namespace(json=True, bench="fake")) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"figure", "machine", "provenance"}
    assert {"machine", "commit", "date", "quiet", "load_per_cpu"} <= set(out["provenance"])
    assert out["provenance"]["date"].endswith("Z")
    assert out["provenance"]["agent_compile_decode"] == "0"  # the agents' decode: eager


@pytest.mark.slow
def test_serve_json_keys_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "serve", "--json", "--requests", "6", "--time-scale", "8"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out) == SERVE_KEYS | {"provenance"}
    assert out["completed"] == 6 and out["failed"] == 0
    assert out["generated_tokens"] > 0 and out["ttft_p50_ms"] > 0
