"""Locality-aware block placement (pure policy) and its simulation rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.policies.variants import locality as pl

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"


def _chains() -> list[pl.ChainUse]:
    return [
        pl.ChainUse(("a0", "a1", "a2"), 100, 10.0),
        pl.ChainUse(("a0", "a1", "av"), 30, 10.0),
        pl.ChainUse(("b0", "b1"), 50, 10.0),
        pl.ChainUse(("a2", "b1"), 1, 10.0),
    ]


def test_traffic_counts_adjacent_pairs_both_directions() -> None:
    chains = [*_chains(), pl.ChainUse(("a1", "a0"), 5, 2.0)]
    got = {(p.a, p.b): p for p in pl.traffic(chains)}
    assert got[("a0", "a1")].count == 135
    assert got[("a0", "a1")].nbytes == 100 * 10 + 30 * 10 + 5 * 2
    assert got[("a1", "a2")].count == 100 and got[("a2", "b1")].count == 1
    assert ("a0", "a2") not in got  # not adjacent in any chain
    assert pl.traffic(chains)[0].a == "a0"  # most bytes first


def test_locality_keeps_co_used_blocks_together_when_memory_allows() -> None:
    blocks = {"a0": 4.0, "a1": 4.0, "a2": 4.0, "av": 4.0, "b0": 4.0, "b1": 4.0}
    servers = {"s0": 16.0, "s1": 8.0}
    on = pl.place(blocks, servers, _chains(), locality=True)
    off = pl.place(blocks, servers, _chains(), locality=False)
    assert not on.unplaced and not off.unplaced
    assert len({on.server_of[b] for b in ("a0", "a1", "a2", "av")}) == 1
    assert on.server_of["b0"] == on.server_of["b1"]
    assert on.cross_server_bytes == 10.0  # only the rare a2 -> b1 hop crosses
    assert off.cross_server_bytes > on.cross_server_bytes
    assert on.local_bytes + on.cross_server_bytes == off.local_bytes + off.cross_server_bytes


def test_memory_is_never_exceeded_and_what_fits_nowhere_is_reported() -> None:
    blocks = {"a0": 6.0, "a1": 6.0, "a2": 6.0, "av": 6.0, "b0": 6.0, "b1": 30.0}
    servers = {"s0": 12.0, "s1": 12.0}
    for locality in (True, False):
        plan = pl.place(blocks, servers, _chains(), locality=locality)
        assert "b1" in plan.unplaced  # 30 bytes fit no 12-byte server
        for s, cap in servers.items():
            assert sum(blocks[b] for b, at in plan.server_of.items() if at == s) <= cap
        assert set(plan.server_of) | set(plan.unplaced) == set(blocks)


def test_place_is_deterministic_and_ignores_unknown_blocks_in_chains() -> None:
    blocks = {"a0": 1.0, "a1": 1.0}
    chains = [pl.ChainUse(("a0", "zz", "a1"), 3, 1.0)]
    one = pl.place(blocks, {"s0": 1.0, "s1": 1.0}, chains)
    assert one == pl.place(blocks, {"s0": 1.0, "s1": 1.0}, chains)
    assert not one.unplaced


def test_chain_use_validates() -> None:
    with pytest.raises(ValueError):
        pl.ChainUse((), 1, 1.0)


@pytest.mark.skipif(not TRACE.exists(), reason="shared trace absent")
def test_sim_rows_locality_on_vs_off_are_labelled_simulation() -> None:
    from tessera.sim import blockllm_placement
    from tessera.sim.bench import profile_of

    rows = blockllm_placement.placement_rows(profile_of("llama-2-7b"), str(TRACE), True, 60.0)
    assert {r["label"] for r in rows} == {"simulation"}
    assert len(rows) == 6  # per link: frag-min, locality, their ratio
    for off, on, ratio in (rows[:3], rows[3:]):
        assert (off["placement"], on["placement"]) == ("frag_min", "locality")
        assert on["cross_server_bytes"] < off["cross_server_bytes"]
        assert on["p95_latency_s"] <= off["p95_latency_s"]
        assert "paper" in ratio and ratio["cross_server_bytes_cut"] > 0


def test_simulate_queues_transfers_in_the_order_they_are_ready() -> None:
    """A long prefill computed later must not hold the link for a token ready earlier."""
    from tessera.cost.profile import Link
    from tessera.sim import blockllm_placement
    from tessera.sim.bench import profile_of

    prof = profile_of("llama-2-7b")
    where = {"x": "s0", "y": "s1"}
    slow = Link(bandwidth_bytes_per_s=1e6, latency_s=0.0)  # 8 KB token: 8 ms on the wire
    short, long = (0.0, 1, 1, ("x", "y")), (0.0, 4000, 1, ("x", "y"))
    alone = blockllm_placement.simulate(prof, [short, short], where, slow)
    # the long prefill comes first in the stream but is ready last: the shorts go first
    both = blockllm_placement.simulate(prof, [long, short, short], where, slow)
    assert both["p50_latency_s"] == pytest.approx(alone["p50_latency_s"])
    assert both["p95_latency_s"] > 30.0  # 32 MB at 1 MB/s
