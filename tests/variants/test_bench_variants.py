"""`tessera bench variants` runs end to end on a very small configuration: one JSON object,
the shared configuration holds fewer parameter bytes than one copy per variant, and every
request's tokens are the same under both; opted in to shareEquivalent, the fine-tune's
equivalent layer is the foundation's and the bytes drop further."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_bench_variants_smoke() -> None:
    cmd = [sys.executable, "-m", "tessera.cli.main", "bench", "variants", "--json"]
    cmd += ["--sizes", "3", "--requests-per-variant", "2", "--hidden", "64", "--layers", "4"]
    cmd += ["--diff-layers", "1", "--kv-mib", "1", "--new", "4", "--rate", "20"]
    cmd += ["--cobatch-rounds", "1"]
    cmd += ["--share-equivalent"]  # the fine-tune's one changed layer: a little (std 0.002)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    (r,) = doc["results"]
    assert doc["tokens_match"] is True and r["tokens_match"] is True
    assert (r["variants"], r["lora"], r["full_finetunes"], r["requests"]) == (3, 2, 1, 6)
    assert 0 < r["param_bytes_shared"] < r["param_bytes_per_model"]
    assert r["throughput_ratio"] > 0 and r["p95_latency_ratio"] > 0
    # the A/B of per-block batching ran, and the co-batched agent's counters were read
    assert r["cobatch_throughput_ratio"] > 0 and r["cobatch_p95_latency_ratio"] > 0
    assert r["cobatch_solo_steps"] + r["cobatch_cobatched_steps"] > 0
    co = doc["cobatch_in_process"]  # the engine-only A/B: every chain's tokens equal
    assert co["tokens_match"] is True and co["cobatched_steps"] > 0
    # opted in, the fine-tune's equivalent layer is the foundation's: one layer fewer
    assert r["equivalent_layers_shared"] == {"ft2": [r["equivalent_layers_shared"]["ft2"][0]]}
    assert 0 < r["param_bytes_shared_equivalent"] < r["param_bytes_shared"]
    assert 0 < r["equivalence_top1_agreement_min"] <= 1
