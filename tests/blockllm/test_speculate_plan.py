"""Speculated chains, pure (issue 35): the cut at the foundation's boundaries and the
bottleneck's ends, each block beside the foundation's stage holding its first layer, the
bottleneck marked, routes, the status line, and the proto round trip."""

from __future__ import annotations

import itertools

from tessera import blocks, routes_doc, variant_spec
from tessera.control import speculate_ops
from tessera.policies.transition import model as transition_model
from tessera.policies.variants import plan as variant_plan
from tessera.policies.variants import speculate_chains
from tessera.rpc import blocks as rpc_blocks
from tessera.rpc.v1 import agent_pb2 as pb

FID = "default.sp.r0.g1"


def _target(bounds: list[int]) -> transition_model.Target:
    placed = []
    for i, (s, e) in enumerate(itertools.pairwise(bounds)):
        b = blocks.Block(
            "/m",
            s,
            e,
            replica_id=FID,
            stage_index=i,
            num_stages=len(bounds) - 1,
            kv_bytes=1 << 20,
            generation=1,
        )
        placed.append(transition_model.Placed(f"agent-{i}", f"a{i}:1", b))
    return transition_model.Target(1, tuple(placed), (routes_doc.RouteReplica(FID, "a0:1"),))


def _v(layers: tuple[int, int], name: str = "quick") -> variant_spec.VariantSpec:
    return variant_spec.VariantSpec(name, "speculate", "", zoo="/zoo", layers=layers)


def test_a_chain_is_cut_beside_the_foundation_with_the_bottleneck_marked() -> None:
    out = speculate_chains.with_speculate_chains(_target([0, 2, 4]), [_v((1, 2))])
    rid = variant_plan.variant_replica_id(FID, "quick")
    chain = sorted(
        (p for p in out.target.blocks if p.block.replica_id == rid),
        key=lambda p: p.block.stage_index,
    )
    assert [(p.block.start, p.block.end, p.agent) for p in chain] == [
        (0, 1, "agent-0"),
        (1, 2, "agent-0"),
        (2, 4, "agent-1"),
    ]
    assert [p.block.speculate_zoo for p in chain] == ["", "/zoo", ""]
    assert [p.block.next_address for p in chain] == ["a0:1", "a1:1", ""]
    assert all(p.block.num_stages == 3 and p.block.kv_bytes == 1 << 20 for p in chain)
    assert routes_doc.RouteReplica(rid, "a0:1") in out.target.replicas
    (line,) = out.lines("quick")
    assert line.endswith("the stage after it on another agent")
    # a bottleneck that spans a foundation boundary: that boundary is not a cut
    out = speculate_chains.with_speculate_chains(_target([0, 2, 4, 6]), [_v((1, 3))])
    assert out.chains[0].stages == (
        (0, 1, "agent-0"),
        (1, 3, "agent-0"),
        (3, 4, "agent-1"),
        (4, 6, "agent-2"),
    )
    # one stage: the chain is still three (all beside it, the hop to the agent itself)
    out = speculate_chains.with_speculate_chains(_target([0, 4]), [_v((2, 3))])
    assert out.chains[0].stages == ((0, 2, "agent-0"), (2, 3, "agent-0"), (3, 4, "agent-0"))
    assert out.chains[0].line().endswith("on the same agent")
    # no block before or after it: no chain (validation refuses it first)
    assert speculate_chains.with_speculate_chains(_target([0, 4]), [_v((0, 1))]).chains == ()
    assert speculate_chains.with_speculate_chains(_target([0, 4]), [_v((3, 4))]).chains == ()


def test_routes_status_and_the_proto_round_trip() -> None:
    (r,) = variant_plan.routes([_v((1, 2))], [FID], frozenset())
    assert r.kind == "full" and r.replicas == (variant_plan.variant_replica_id(FID, "quick"),)
    m = pb.BlockSpeculate(kind="pseudo", hits=6, misses=2, speculated_steps=5, mixed_steps=1)
    rep = speculate_ops.add(None, m, (1, 2))
    rep = speculate_ops.add(rep, m, (1, 2))  # two chains add up
    assert rep["hits"] == 12 and rep["misses"] == 4 and rep["hitRate"] == 0.75
    assert rep["chains"] == 2
    rep["placement"] = ["x: [0, 1) on agent-0"]
    (st,) = variant_plan.status(
        [_v((1, 2))], [], {"quick": [FID]}, frozenset([FID]), {}, None, None, {"quick": rep}
    )
    assert st.ready and st.to_json()["speculate"] == rep
    assert "speculating on layers [1, 2]; surrogate pseudo; hit rate 0.75" in st.message
    b = blocks.Block("/m", 1, 2, replica_id="x", stage_index=1, num_stages=3, speculate_zoo="/z")
    assert rpc_blocks.load_request(b).speculate.zoo == "/z"
    assert rpc_blocks.from_proto(rpc_blocks.to_proto(b)).speculate_zoo == "/z"
    assert not b.same_layout(blocks.Block("/m", 1, 2, replica_id="x", stage_index=1, num_stages=3))
