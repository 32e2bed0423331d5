"""`tessera bench gpu --device cpu --tiny` runs every part and prints one JSON object (CI
runs the GPU check's logic on CPU; the CUDA graphs replay through the fake graph API)."""

from __future__ import annotations

import json

import pytest

from tessera.cli import main as cli

pytestmark = pytest.mark.slow


def test_bench_gpu_tiny_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "gpu", "--json", "--device", "cpu", "--tiny"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["errors"] == {}, out["errors"]
    tiny = out["tiny"]
    assert tiny["dtype"] == "bfloat16"  # the checkpoint's torch_dtype, by default
    for key in (
        "ms_per_step_b1",
        "roofline_ms_b1",
        "b1_vs_roofline",
        "tok_s_b16",
        "tok_s_b64",
        "tok_s_b256",
        "ttft_ms_prompt2048",
        "graph_capture_s",
    ):
        assert tiny[key] > 0, key
    assert tiny["decode_path"] == "cuda graphs" and tiny["graph_buckets"] > 0
    assert tiny["logprob_ratio_vs_hf"] <= 1.5
    assert tiny["errors"] == {"peak_gib": "not measured on CPU"}
    assert out["tokens_match_fp32"] is True
    assert out["served_tok_s_c64"] > 0
    mem = out["served_detail"]["memory"]  # the agent's booking, from its Describe
    assert mem["device_capacity_gib"] == [2.0] and mem["gpu_memory_utilization"] == 0.9
    assert out["served_kv_pool_gib"] == mem["kv_pool_gib"] == 64 / 1024 and mem["kv_pages"] > 0
    att = out["attention"]  # the backends' part, in its child process
    assert att["backends"]["native"]["decode_ms_b64"] > 0
    assert att["backends"]["flex"]["max_abs_diff"] < 1e-4  # float32 on CPU
    assert "flashinfer" in att["backends"]["flashinfer"]["error"]
    assert out["attention_backend_choice"] == att["choice"]["attention_backend"]


def test_bench_gpu_failures_are_recorded_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "gpu", "--json", "--device", "cpu", "--shapes", "7b"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "7b" in out["errors"]["run"]
