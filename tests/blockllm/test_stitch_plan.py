"""Pure: the `stitch` variant field, the stitched chains' blocks and their placement on two
agents (co-used blocks together when memory allows, spread when it does not, a loaded chain
kept where it is), routes, status, and the proto round trip of a stitched front."""

from __future__ import annotations

import dataclasses

import pytest

from tessera import blocks, fields, routes_doc, variant_spec
from tessera.policies import placement
from tessera.policies.transition import model as transition_model
from tessera.policies.variants import locality as placement_locality
from tessera.policies.variants import plan as variant_plan
from tessera.policies.variants import stitch_chains
from tessera.rpc import blocks as rpc_blocks

MB = 1 << 20
KV = stitch_chains.DEFAULT_CHAIN_KV_BYTES  # 16 MiB a chain block's KV pool
LARGE = placement.ModelBytes(6, 1 * MB, 2 * MB, 2 * MB)  # 10 MiB
SMALL = placement.ModelBytes(4, 0.25 * MB, 1 * MB, 1 * MB)
FID = "default.fam.r0.g1"
CHAIN = "default.fam.r0-fast.g1"


def _spec(point: list[int] | None = None, **extra: object) -> tuple[variant_spec.VariantSpec, ...]:
    doc = [{"name": "fast", "stitch": {"small": "s", "point": point or [2, 3], "zoo": "z"}}]
    doc[0].update(extra)
    return variant_spec.parse(doc, "tiny-large")


def test_the_stitch_field_parses_and_refuses_what_it_cannot_serve() -> None:
    (v,) = _spec()
    assert (v.kind, v.path, v.point, v.zoo) == ("stitch", "s", (2, 3), "z")
    assert variant_spec.parse([v.to_json()], "tiny-large") == (v,)
    for point in ([2], [0, 3], [2, "3"], [True, 3]):
        with pytest.raises(fields.FieldError, match="point"):
            _spec(point)
    with pytest.raises(fields.FieldError, match="exactly one"):
        _spec(checkpoint="c")
    with pytest.raises(fields.FieldError, match="full fine-tunes"):
        _spec(shareEquivalent=True)
    with pytest.raises(fields.FieldError, match="unknown field"):
        variant_spec.parse(
            [{"name": "f", "stitch": {"small": "s", "point": [1, 2], "zoo": "z", "x": 1}}], "m"
        )


def _target() -> transition_model.Target:
    b = blocks.Block("/m/large", 0, 6, replica_id=FID, kv_bytes=8 * MB, generation=1)
    return transition_model.Target(
        1,
        (transition_model.Placed("agent-0", "a0:1", b),),
        (routes_doc.RouteReplica(FID, "a0:1"),),
    )


def _rooms(free0: float, free1: float) -> list[stitch_chains.AgentRoom]:
    held = frozenset(("/m/large", u) for u in range(8))  # agent-0 holds the whole large model
    return [
        stitch_chains.AgentRoom("agent-0", "a0:1", "cpu:0", free0, held),
        stitch_chains.AgentRoom("agent-1", "a1:1", "cpu:0", free1),
    ]


def _place(
    free0: float,
    free1: float,
    held: dict[str, dict[int, str]] | None = None,
    locality: bool = True,
) -> stitch_chains.StitchPlacement:
    specs = [dataclasses.replace(v, path="/m/small", zoo="/m/zoo") for v in _spec()]
    return stitch_chains.with_stitch_chains(
        _target(),
        specs,
        "/m/large",
        LARGE,
        {"/m/small": SMALL},
        _rooms(free0, free1),
        held,
        locality=locality,
    )


def _where(p: stitch_chains.StitchPlacement) -> tuple[str, str]:
    (c,) = p.chains
    return c.front_agent, c.tail_agent


def test_the_chain_is_the_small_front_with_the_stitch_and_the_large_tail() -> None:
    p = _place(1000 * MB, 1000 * MB)
    chain = [x for x in p.target.blocks if x.block.replica_id == CHAIN]
    front, tail = sorted((x.block for x in chain), key=lambda b: b.stage_index)
    assert (front.model_path, front.start, front.end, front.num_stages) == ("/m/small", 0, 2, 2)
    assert (front.stitch_zoo, front.stitch_to, front.stitch_at) == ("/m/zoo", "/m/large", 3)
    assert (tail.model_path, tail.start, tail.end, tail.stitch_zoo) == ("/m/large", 3, 6, "")
    assert front.generation == tail.generation == 1
    assert routes_doc.RouteReplica(CHAIN, "a0:1") in p.target.replicas
    # a plain front has no stitch; the identity carries it (turning it off reloads)
    assert not front.same_layout(blocks.Block("/m/small", 0, 2, replica_id=CHAIN, num_stages=2))


def test_co_used_blocks_land_on_one_agent_when_memory_allows() -> None:
    # agent-0 holds the large model's pieces: the tail costs only its KV pool there
    front_bytes = SMALL.embedding_bytes + 2 * SMALL.layer_bytes + KV
    p = _place(front_bytes + KV, 1000 * MB)
    assert _where(p) == ("agent-0", "agent-0")
    front, tail = sorted(
        (x for x in p.target.blocks if x.block.replica_id == CHAIN),
        key=lambda x: x.block.stage_index,
    )
    assert (
        tail.agent == "agent-0" and front.block.next_address == "a0:1" and front.address == "a0:1"
    )
    assert p.lines("fast") == [
        f"{CHAIN}: front small[0, 2) -> stitch -> tail large[3, 6), both on agent-0"
    ]


def test_together_elsewhere_when_the_holder_is_full_and_spread_when_none_has_room() -> None:
    front_bytes = SMALL.embedding_bytes + 2 * SMALL.layer_bytes + KV
    tail_bytes = 3 * LARGE.layer_bytes + LARGE.lm_head_bytes + KV
    # agent-0 has room for the tail's KV only; agent-1 for both blocks: together there
    assert _where(_place(KV, front_bytes + tail_bytes)) == ("agent-1", "agent-1")
    # agent-1 has room for the front only: the chain spreads, the tail beside its pieces
    p = _place(KV, front_bytes)
    assert _where(p) == ("agent-1", "agent-0")
    assert "spread: front on agent-1, tail on agent-0" in p.lines("fast")[0]
    # no room anywhere: left out, and said so
    p = _place(KV / 2, KV / 2)
    assert p.chains == () and p.lines("fast") == [f"{CHAIN}: no agent has room for its blocks"]
    assert not [x for x in p.target.blocks if x.block.replica_id == CHAIN]


def test_a_loaded_chain_stays_where_it_is() -> None:
    p = _place(1000 * MB, 1000 * MB, held={CHAIN: {0: "agent-1", 1: "agent-1"}})
    assert _where(p) == ("agent-1", "agent-1")


def test_locality_keeps_the_hop_inside_an_agent_where_best_fit_does_not() -> None:
    front_bytes = SMALL.embedding_bytes + 2 * SMALL.layer_bytes + KV
    tail_bytes = 3 * LARGE.layer_bytes + LARGE.lm_head_bytes + KV
    on, off = (_place(front_bytes + KV, tail_bytes + MB, locality=x) for x in (True, False))
    assert (on.policy, off.policy) == ("locality", "frag_min")
    assert _where(on) == ("agent-0", "agent-0")
    assert _where(off) == ("agent-0", "agent-1")  # best fit: the tail into the fullest


def test_place_costs_and_held_blocks() -> None:
    chains = [placement_locality.ChainUse(("a", "b"), 1.0, 10.0)]
    got = placement_locality.place(
        {"a": 5.0, "b": 5.0}, {"s1": 6.0, "s2": 10.0}, chains, cost={"b": {"s1": 1.0}}
    )
    assert got.server_of == {"a": "s1", "b": "s1"}  # b shares pieces on s1: both fit there
    got = placement_locality.place({"a": 5.0, "b": 5.0}, {"s1": 6.0, "s2": 10.0}, chains)
    assert got.server_of == {"a": "s2", "b": "s2"}
    for free, hops in ((6.0, 0.0), (4.0, 1.0)):  # a stays on s1; b joins it if it fits
        got = placement_locality.place(
            {"a": 5.0, "b": 5.0}, {"s1": free, "s2": 10.0}, chains, held={"a": "s1"}
        )
        assert got.server_of["a"] == "s1" and got.cross_server_hops == hops


def test_routes_status_and_the_proto_round_trip() -> None:
    (v,) = _spec()
    (r,) = variant_plan.routes([v], [FID], frozenset())
    assert (r.kind, r.replicas) == ("full", (CHAIN,))  # own replicas, like a full fine-tune
    report = {
        "point": [2, 3],
        "cosine": 0.967,
        "top1Agreement": 0.896,
        "placement": [f"{CHAIN}: front small[0, 2) -> stitch -> tail large[3, 6), both on a"],
    }
    (s,) = variant_plan.status(
        [v], [], {"fast": [CHAIN]}, frozenset({CHAIN}), {}, None, {"fast": report}
    )
    assert s.ready and s.kind == "stitch"
    assert "stitched at [2, 3]; measured vs the model alone: top-1 agreement 0.896" in s.message
    assert "both on a" in s.message and s.to_json()["stitch"] == report
    b = blocks.Block(
        "/m/small",
        0,
        2,
        replica_id=CHAIN,
        num_stages=2,
        stitch_zoo="/z",
        stitch_to="/l",
        stitch_at=3,
    )
    assert rpc_blocks.from_load_request(rpc_blocks.load_request(b)).same_layout(b)
    assert rpc_blocks.from_proto(rpc_blocks.to_proto(b)).same_layout(b)


def test_the_converge_shell_reads_each_agents_room_from_what_it_observes() -> None:
    from tessera import observed
    from tessera.control import stitch_ops

    (v,) = _spec()
    v = dataclasses.replace(v, path="/m/small", zoo="/m/zoo")
    facts = {"/m/large": LARGE, "/m/small": SMALL}.get

    def obs(cap0: float, cap1: float, held: tuple[blocks.Block, ...] = ()) -> observed.Observed:
        def dev(cap: float) -> tuple[observed.DeviceInfo, ...]:
            return (observed.DeviceInfo("cpu:0", "cpu", int(cap), int(cap)),)

        return observed.Observed(
            (
                observed.AgentInfo("agent-0", "a0:1", devices=dev(cap0)),
                observed.AgentInfo("agent-1", "a1:1", devices=dev(cap1), blocks=held),
            )
        )

    def where(o: observed.Observed) -> tuple[str, str]:
        p = stitch_ops.place(_target(), [v], "/m/large", facts, o, "default.fam.")
        return _where(p)

    foundation = LARGE.total_bytes + 8 * MB  # its parameters and KV pool on agent-0
    front_bytes = SMALL.embedding_bytes + 2 * SMALL.layer_bytes + KV
    assert where(obs(foundation + front_bytes + KV, 1000 * MB)) == ("agent-0", "agent-0")
    assert where(obs(foundation + KV, front_bytes)) == ("agent-1", "agent-0")  # spread
    # loaded on agent-1 already: it stays, whatever agent-0 has now
    loaded = tuple(
        blocks.Block(path, a, b, replica_id=CHAIN, stage_index=i, num_stages=2)
        for i, (path, a, b) in enumerate((("/m/small", 0, 2), ("/m/large", 3, 6)))
    )
    assert where(obs(1000 * MB, 1000 * MB, loaded)) == ("agent-1", "agent-1")
