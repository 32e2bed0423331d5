"""`tessera bench coldstart --tiny` (issue 32): the keys, the sources and tokens_match.

One round on the 2-layer random checkpoint, three agent processes: every figure is
present and positive, each replica's bytes came from where the scenario says (storage,
then a peer, then the host cache), and every replica's greedy tokens equal transformers'.
Timings are not asserted (a shared CI machine): the full-size run is in docs/scaling.md.
"""

from __future__ import annotations

import argparse

import pytest

from tessera.cli import bench_coldstart

pytestmark = pytest.mark.slow


def test_tiny_coldstart_reports_every_key_and_matching_tokens() -> None:
    parser = argparse.ArgumentParser()
    bench_coldstart.add_arguments(parser)
    out = bench_coldstart.run(parser.parse_args(["--tiny", "--rounds", "1", "--tokens", "4"]))
    for key in ("ready_s_storage", "ready_s_peer", "ready_s_host_cache"):
        assert out[key] > 0, key
    assert out["tokens_match"] is True and out["tokens_match_transformers"] is True
    assert out["first_token_s_from_zero"] > 0 and out["wake_s"] > 0  # sleep and wake
    assert out["lost"] == 0 and out["from_zero"]["requests_from_zero"] == 4
    assert "200 MB/s" in out["storage_throttle"]
    total = out["checkpoint_bytes"]
    (storage,), (peer,), (host,) = (out["runs"][k] for k in ("storage", "peer", "host_cache"))
    assert storage["sources"]["storage"] > 0.99 * total - 4096 and storage["sources"]["peer"] == 0
    assert peer["sources"]["peer"] == storage["sources"]["storage"]  # the data plane's part
    assert peer["sources"]["storage"] == 0
    assert host["sources"]["host"] == storage["sources"]["storage"]
    assert host["sources"]["peer"] == host["sources"]["storage"] == 0
    # the plan chose the host cache: it saw agent-2's cache in Describe
    assert any("copy from host cache" in step for step in host["steps"]), host["steps"]
    assert out["measured_links"]["storage_bytes_per_s"]  # measured, not assumed
