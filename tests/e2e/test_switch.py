"""A layout switch on local agents through the switch plan, with requests in flight.

One lean run of `tessera bench switch` (peer mode only, the default-size tiny model, few
requests): 2 whole replicas → 1 whole + a 2-stage pipeline → the pipeline's stage
boundary moved onto the other agents. Every load takes its parameters in parts chosen by
the OServe switch plan (the moved boundary's first stage from both agents: its own agent's
old stage and the peer), nothing is read from storage, every request completes with
`transformers`' greedy text, and long requests on the leaving replica move their KV.
"""

from __future__ import annotations

import argparse

import pytest

from tessera.cli import bench_switch

pytestmark = pytest.mark.slow


def test_switches_copy_by_the_plan_lose_nothing_and_match_transformers() -> None:
    parser = argparse.ArgumentParser()
    bench_switch.add_arguments(parser)
    args = parser.parse_args(
        "--modes peer --requests 12 --time-scale 2 --long-tokens 256 --drain-deadline 0.2 "
        "--max-output 16 --hidden 256 --intermediate 704".split()
    )
    out = bench_switch.run(args)
    assert out["lost"] == 0, out["lost_examples"]
    assert out["requests_sent"] == 12 + 2 * 2
    assert out["tokens_match"] and out["tokens_compared"] == out["requests_sent"]
    assert out["switches"] == [bench_switch.rl.LAYOUTS[i][0] for i in bench_switch.SEQUENCE[1:]]
    loads = out["loads_peer"]
    assert len(loads) == 4, loads  # two stages per switch
    assert all("(copy from" in x for x in loads), loads  # no load read storage
    # the stage [0, 6) on agent-1: layers 4-5 from its own agent, the rest from agent-0
    assert any("layers [0, 6)" in x and "copy from agent-0, agent-1)" in x for x in loads)
    assert out["plan_vs_bound"] and all(r >= 1.0 for r in out["plan_vs_bound"])
    assert out["cutover_requests"]["peer"][0].get("moved", 0) >= 1, out["cutover_requests"]
