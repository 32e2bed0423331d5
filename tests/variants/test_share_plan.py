"""The `shareEquivalent` opt-in as data (no servers): the spec field and its errors, the
chains it marks, the status it reports, and the planner's pricing of a full fine-tune's
chain by its non-shared units (more variants fit one memory budget)."""

from __future__ import annotations

import dataclasses

import pytest

from tessera import api, blocks, fields, routes_doc, variant_spec
from tessera.policies import placement
from tessera.policies.transition import model as transition_model
from tessera.policies.variants import memory as variant_memory
from tessera.policies.variants import plan as variant_plan
from tessera.rpc import blocks as rpc_blocks

V = variant_spec.VariantSpec
MB = 1 << 20


def test_spec_opt_in_parses_and_refuses_misuse() -> None:
    got = variant_spec.parse(
        [
            {"name": "med", "checkpoint": "/ft/med", "shareEquivalent": True},
            {"name": "law", "checkpoint": "/ft/law", "shareEquivalent": True, "threshold": 0.9},
            {"name": "own", "checkpoint": "/ft/own"},
        ],
        "base",
    )
    assert got == (
        V("med", "full", "/ft/med", True, 0.98),
        V("law", "full", "/ft/law", True, 0.9),
        V("own", "full", "/ft/own"),
    )
    assert got[1].to_json() == {
        "name": "law",
        "checkpoint": "/ft/law",
        "shareEquivalent": True,
        "threshold": 0.9,
    }
    assert got[2].to_json() == {"name": "own", "checkpoint": "/ft/own"}  # unchanged off
    assert variant_spec.parse([v.to_json() for v in got], "base") == got
    bad = [
        ({"name": "x", "adapter": "a", "shareEquivalent": True}, "full fine-tunes"),
        ({"name": "x", "checkpoint": "c", "threshold": 0.9}, "only with shareEquivalent"),
        ({"name": "x", "checkpoint": "c", "shareEquivalent": True, "threshold": 1.5}, "<= 1"),
        ({"name": "x", "checkpoint": "c", "shareEquivalent": True, "threshold": 0}, "> 0"),
        ({"name": "x", "checkpoint": "c", "shareEquivalent": "yes"}, "true or false"),
    ]
    for doc, why in bad:
        with pytest.raises(fields.FieldError, match=why):
            variant_spec.parse([doc], "base")
    manifest = {
        "apiVersion": "serving.tessera.dev/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": "d"},
        "spec": {
            "model": {"name": "base", "path": "/m"},
            "variants": [{"name": "med", "checkpoint": "/c", "shareEquivalent": True}],
        },
    }
    assert api.parse(manifest).spec.variants == (V("med", "full", "/c", True),)


def _target() -> transition_model.Target:
    placed = tuple(
        transition_model.Placed(
            f"a{i}",
            f"h:{i}",
            blocks.Block("/base", 4 * i, 4 * i + 4, replica_id="r0", stage_index=i, num_stages=2),
        )
        for i in range(2)
    )
    return transition_model.Target(1, placed, (routes_doc.RouteReplica("r0", "h:0"),))


def test_chains_carry_the_opt_in_to_the_load_and_back() -> None:
    t = variant_plan.with_full_chains(
        _target(), [V("med", "full", "/ft/med", True, 0.95), V("own", "full", "/ft/own")]
    )
    by = {(p.block.replica_id, p.block.stage_index): p.block for p in t.blocks}
    med, own = by[("r0-med", 1)], by[("r0-own", 1)]
    assert (med.share_from, med.share_threshold) == ("/base", 0.95)
    assert (own.share_from, own.share_threshold) == ("", 0.0)  # without: today's block
    assert own.param_bytes == med.param_bytes == 0  # sharing unknown: as before
    req = rpc_blocks.load_request(med)
    assert req.share.foundation_path == "/base" and req.share.threshold == pytest.approx(0.95)
    assert rpc_blocks.from_load_request(req) == med
    assert not rpc_blocks.load_request(own).HasField("share")
    assert rpc_blocks.from_proto(rpc_blocks.to_proto(med)).same_layout(med)
    # the opt-in is part of the block's identity: turning it on reloads the chain
    assert not med.same_layout(dataclasses.replace(med, share_threshold=0.9))


REPORT = {
    "threshold": 0.98,
    "layers": [
        {"layer": 0, "cosine": 1.0, "identical": True, "shared": True},
        {"layer": 1, "cosine": 0.9991, "identical": False, "shared": True},
        {"layer": 2, "cosine": 0.41, "identical": False, "shared": False},
        {"layer": 3, "cosine": 1.0, "identical": True, "shared": True},
    ],
    "finalCosine": 0.9984,
    "top1Agreement": 0.914,
    "calibration": "uniform-ids-seed0-4x32",
    "calibrationTokens": 128,
}


def test_status_reports_the_equivalence_measured() -> None:
    vs = [V("med", "full", "/ft/med", True), V("own", "full", "/ft/own")]
    st = variant_plan.status(
        vs,
        [],
        {"med": ["r0-med"], "own": ["r0-own"]},
        frozenset({"r0-med", "r0-own"}),
        {},
        {"med": REPORT},
    )
    med, own = st[0].to_json(), st[1].to_json()
    assert med["equivalence"] == REPORT and med["ready"] is True
    assert "equivalent layers shared [1], own [2]" in str(med["message"])
    assert "top-1 agreement 0.914" in str(med["message"])
    assert "equivalence" not in own and own["message"] == "1/1 chains hold every block"


MODEL = placement.ModelBytes(num_layers=4, layer_bytes=100 * MB, embedding_bytes=50 * MB,
                             lm_head_bytes=60 * MB)  # fmt: skip


def test_chain_costs_only_its_own_units_where_the_foundation_is_held() -> None:
    sharing = variant_memory.from_report("med", REPORT)
    assert sharing.own_layers == frozenset({2})
    whole = placement.StagePlacement((0, 4), (("n", 0),))
    assert variant_memory.chain_stage_bytes(MODEL, whole, sharing) == 100 * MB
    # no foundation held there (or no zoo): the full copy
    assert variant_memory.chain_stage_bytes(MODEL, whole, sharing, False) == MODEL.total_bytes
    # a pipelined chain: each stage only its own units; tp splits the bytes per rank
    first = placement.StagePlacement((0, 2), (("n", 0), ("n", 1)))
    last = placement.StagePlacement((2, 4), (("n", 2),))
    assert variant_memory.chain_stage_bytes(MODEL, first, sharing) == 0
    assert variant_memory.chain_stage_bytes(MODEL, last, sharing) == 100 * MB
    diff_head = variant_memory.ChainSharing("x", frozenset({0}), own_head=True)
    assert variant_memory.chain_stage_bytes(MODEL, last, diff_head) == 60 * MB
    assert variant_memory.chain_stage_bytes(MODEL, first, diff_head) == 50 * MB
    with pytest.raises(fields.FieldError, match="outside"):
        variant_memory.chain_stage_bytes(MODEL, whole, variant_memory.ChainSharing("y", {9}))  # type: ignore[arg-type]


def test_sharing_fits_more_variants_in_the_same_memory() -> None:
    replica = placement.ReplicaPlacement("r0", (placement.StagePlacement((0, 4), (("n", 0),)),))
    free = {("n", 0): 1000.0 * MB}  # left on the device after the foundation
    identical_only = variant_memory.ChainSharing("a", frozenset({1, 2}))  # 2 layers differ
    opted_in = variant_memory.ChainSharing("b", frozenset({2}))  # 1 of them equivalent
    many = [variant_memory.ChainSharing(f"v{i}", frozenset({2})) for i in range(12)]
    per_model = variant_memory.fit_variants(MODEL, replica, free, many, shared=False)
    shared = variant_memory.fit_variants(MODEL, replica, free, many)
    assert len(per_model.fitted) == 1  # 510 MB a copy
    assert len(shared.fitted) == 10 and shared.left_out == ("v10", "v11")
    assert shared.param_bytes == 10 * 100 * MB
    # the opt-in halves a chain's cost here: 5 vs 10 chains
    both = variant_memory.fit_variants(MODEL, replica, free, [identical_only] * 6)
    assert len(both.fitted) == 5
    assert len(variant_memory.fit_variants(MODEL, replica, free, [opted_in] * 12).fitted) == 10
    # and the transition target's chain blocks carry the planned bytes
    model8 = placement.ModelBytes(8, 100 * MB, 50 * MB, 60 * MB)
    t = variant_plan.with_full_chains(
        _target(),  # two stages: layers [0, 4) and [4, 8)
        [V("med", "full", "/ft/med", True), V("own", "full", "/ft/own")],
        sharing={"med": variant_memory.from_report("med", REPORT)},
        model=model8,
    )
    by = {(p.block.replica_id, p.block.stage_index): p.block for p in t.blocks}
    assert by[("r0-med", 0)].param_bytes == 100 * MB  # its own layer 2 only
    assert by[("r0-med", 1)].param_bytes == 0  # everything the foundation's
    assert by[("r0-own", 0)].param_bytes == 0  # sharing unknown: left to the agent


def test_up_prints_the_report_in_the_variant_line() -> None:
    from types import SimpleNamespace

    from tessera.cli import up_report

    (st,) = variant_plan.status(
        [V("med", "full", "/ft/med", True)], [], {"med": ["c"]}, frozenset({"c"}), {},
        {"med": REPORT},
    )  # fmt: skip
    lines: list[str] = []
    up_report.report_variants(SimpleNamespace(variants=[st]), lines.append, {})
    assert lines == [
        "variant med (full): Ready: 1/1 chains hold every block; equivalent layers shared "
        "[1], own [2] (cosine >= 0.98); measured vs the fine-tune alone: top-1 agreement "
        "0.914, cosine 0.9984 on 128 calibration tokens (on c)"
    ]
