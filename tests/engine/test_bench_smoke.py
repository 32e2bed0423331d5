"""`tessera bench engine --quick` runs and its tokens match transformers (no timing asserted)."""

from __future__ import annotations

import json

import pytest

from tessera.cli import main as cli

pytestmark = pytest.mark.slow


def test_bench_engine_quick(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "engine", "--json", "--quick"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["tokens_match"] is True
    for key in (
        "hf_tok_s_b1",
        "hf_tok_s_b8",
        "engine_tok_s_b1",
        "engine_tok_s_b8",
        "pipeline2_tok_s_b8",
        "engine_vs_hf_b8",
        "pipeline2_vs_single_b8",
        "pipeline2_grpc_vs_single_b8",
        "links_on_vs_off_b8",
    ):
        assert out[key] > 0
    assert out["pipeline_activations"] == out["pipeline_results"] == "gloo/gloo"


def test_bench_copy_quick(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "copy", "--json", "--quick"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["tokens_match"] is True
    assert out["param_bytes"] > 0 and out["load_checkpoint_warm_s"] > 0 and out["load_peer_s"] > 0


def test_bench_prefix_quick(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "prefix", "--json", "--quick", "--prefix", "64"]  # 4 requests
    assert cli.main(args) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["tokens_match"] is True
    assert out["prefix_hit_tokens"] == 3 * 64  # 4 full pages, for each request after the first
    assert out["ttft_cached_ms"] > 0 and out["ttft_uncached_ms"] > 0


def test_bench_kvmove_quick(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "kvmove", "--json", "--quick"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["tokens_match"] is True
    assert out["moved_tokens"] == 240  # 15 full pages of the 256-token prompt
    assert out["recompute_ttft_ms"] > 0 and out["move_then_ttft_ms"] > 0
    assert out["transport"] == "gloo" and out["move_grpc_ms"] > 0  # both ways measured
