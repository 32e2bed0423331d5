"""A full fine-tune's chain blocks (issue 35), pure: beside the foundation stage they mirror
when that agent has room (only their own layers and KV are paid there), else placed by the
locality-aware policy next to their chain neighbour; a loaded block never moves; a block
that fits nowhere stays home and is listed; the best fit (`locality=False`) can split
what locality keeps together."""

from __future__ import annotations

from tessera import blocks, routes_doc
from tessera.policies import placement
from tessera.policies.transition import model as transition_model
from tessera.policies.variants import plan as variant_plan
from tessera.policies.variants import stitch_chains, variant_locality

FID = "default.d.r0.g1"
CID = variant_plan.variant_replica_id(FID, "med")
MODEL = placement.ModelBytes(4, 100.0, 100.0, 100.0)  # 4 layers, each unit 100 bytes


def _target(
    stages: list[tuple[int, int, str]], chain_own: float = 100.0
) -> transition_model.Target:
    """The foundation's stages and the mirrored chain (each chain block: one own layer)."""
    placed = []
    n = len(stages)
    for rid, params in ((FID, 0), (CID, chain_own)):
        for i, (s, e, agent) in enumerate(stages):
            nxt = f"{stages[i + 1][2]}:1" if i + 1 < n else ""
            b = blocks.Block(
                "/found" if rid == FID else "/med",
                s,
                e,
                replica_id=rid,
                stage_index=i,
                num_stages=n,
                kv_bytes=10,
                next_address=nxt,
                device="cpu:0",
                param_bytes=int(params),
            )
            placed.append(transition_model.Placed(agent, f"{agent}:1", b))
    reps = (
        routes_doc.RouteReplica(FID, f"{stages[0][2]}:1"),
        routes_doc.RouteReplica(CID, f"{stages[0][2]}:1"),
    )
    return transition_model.Target(1, tuple(placed), reps)


def _rooms(free: dict[str, float]) -> list[stitch_chains.AgentRoom]:
    return [stitch_chains.AgentRoom(a, f"{a}:1", "cpu:0", f) for a, f in sorted(free.items())]


def _where(out: variant_locality.ChainPlacement) -> list[str]:
    got = sorted(
        (p for p in out.target.blocks if p.block.replica_id == CID),
        key=lambda p: p.block.stage_index,
    )
    return [p.agent for p in got]


def test_kept_beside_the_foundation_when_memory_allows() -> None:
    t = _target([(0, 2, "a0"), (2, 4, "a1")])
    out = variant_locality.place_full_chains(
        t, frozenset([CID]), _rooms({"a0": 200, "a1": 200, "a2": 1000}), MODEL
    )
    assert _where(out) == ["a0", "a1"] and out.moved == () and out.target == t


def test_moved_next_to_its_chain_neighbour_when_home_is_full() -> None:
    # a1 has no room for the chain's second block (its own layer + KV: 110 bytes there);
    # the whole block (layers 3, 4 and the head: 300, + KV 10) fits on a0 beside the first
    t = _target([(0, 2, "a0"), (2, 4, "a1")])
    rooms = _rooms({"a0": 500, "a1": 50, "a2": 1000})
    out = variant_locality.place_full_chains(t, frozenset([CID]), rooms, MODEL)
    assert _where(out) == ["a0", "a0"]  # beside its neighbour, where memory allows
    (m,) = out.moved
    assert (m.stage_index, m.home, m.agent) == (1, "a1", "a0")
    first = next(
        p for p in out.target.blocks if p.block.replica_id == CID and p.block.stage_index == 0
    )
    assert first.block.next_address == "a0:1"  # the stream goes to where the block went
    # not enough on a0 for the whole block: it goes where there is room
    out = variant_locality.place_full_chains(
        t, frozenset([CID]), _rooms({"a0": 200, "a1": 50, "a2": 1000}), MODEL
    )
    assert _where(out) == ["a0", "a2"]
    # memory is never exceeded: nowhere fits, it stays home and is listed
    out = variant_locality.place_full_chains(
        t, frozenset([CID]), _rooms({"a0": 110, "a1": 50}), MODEL
    )
    assert _where(out) == ["a0", "a1"] and out.unplaced == ((CID, 1),)


def test_a_loaded_block_stays_and_the_route_follows_the_first_block() -> None:
    t = _target([(0, 2, "a0"), (2, 4, "a1")])
    rooms = _rooms({"a0": 0, "a1": 500, "a2": 1000})
    out = variant_locality.place_full_chains(t, frozenset([CID]), rooms, MODEL)
    assert _where(out)[0] == "a1"  # home full: beside its neighbour on a1
    route = next(r for r in out.target.replicas if r.id == CID)
    assert route.address == "a1:1"
    held = {CID: {0: "a2"}}  # loaded on a2 already: it stays there
    out = variant_locality.place_full_chains(t, frozenset([CID]), rooms, MODEL, held)
    assert _where(out)[0] == "a2"


def test_locality_keeps_together_what_best_fit_splits() -> None:
    t = _target([(0, 2, "a0"), (2, 4, "a1")])
    rooms = _rooms({"a0": 0, "a1": 0, "a2": 700, "a3": 320})
    loc = variant_locality.place_full_chains(t, frozenset([CID]), rooms, MODEL)
    frag = variant_locality.place_full_chains(t, frozenset([CID]), rooms, MODEL, locality=False)
    assert len(set(_where(loc))) == 1  # both on a2
    assert len(set(_where(frag))) == 2  # best fit: the fullest server that fits each
