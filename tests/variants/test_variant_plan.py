"""Variants as data (no servers): the spec, the routes document, the gateway's name table,
the pure variant plan (full fine-tune chains, ordered adapter changes, status), and the
validation-time checks of adapters and fine-tunes against the foundation."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tessera import api, blocks, fields, routes_doc, variant_routes, variant_spec
from tessera.cli import variant_check
from tessera.gateway import errors as gw_errors
from tessera.gateway import request_params
from tessera.gateway import variants as gw_variants
from tessera.policies.transition import model as transition_model
from tessera.policies.variants import plan as variant_plan
from tessera_agent import tiny_checkpoint, tiny_variants

V = variant_spec.VariantSpec


def test_spec_parses_and_names_bad_entries() -> None:
    got = variant_spec.parse(
        [{"name": "legal", "adapter": "a/legal"}, {"name": "med", "checkpoint": "/ft/med"}],
        "base",
    )
    assert got == (V("legal", "lora", "a/legal"), V("med", "full", "/ft/med"))
    bad = [
        ([{"name": "x", "adapter": "a", "checkpoint": "b"}], "exactly one of"),
        ([{"name": "x"}], "exactly one of"),
        ([{"name": "base", "adapter": "a"}], "already served"),
        ([{"name": "x", "adapter": "a"}, {"name": "x", "adapter": "b"}], "already served"),
        ([{"name": "Bad.Name", "adapter": "a"}], "DNS-1123"),
        ([{"name": "x", "adapter": "a", "rank": 4}], "unknown field"),
    ]
    for doc, why in bad:
        with pytest.raises(fields.FieldError, match=why):
            variant_spec.parse(doc, "base")


def test_manifest_variants_parse_through_api() -> None:
    doc = {
        "apiVersion": "serving.tessera.dev/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": "d"},
        "spec": {
            "model": {"name": "base", "path": "/m"},
            "variants": [{"name": "legal", "adapter": "/a"}],
        },
    }
    assert api.parse(doc).spec.variants == (V("legal", "lora", "/a"),)


def test_routes_document_round_trips_variants() -> None:
    doc = routes_doc.RoutesDoc(
        (routes_doc.RouteReplica("r0", "h:1"), routes_doc.RouteReplica("r0-med", "h:1")),
        model="base",
        variants=(
            variant_routes.RouteVariant("legal", "lora"),
            variant_routes.RouteVariant("med", "full", ("r0-med",)),
        ),
    )
    assert routes_doc.parse(json.loads(json.dumps(doc.to_json()))) == doc
    assert "variants" not in routes_doc.RoutesDoc(()).to_json()  # old readers see no change
    with pytest.raises(ValueError, match="duplicate model names"):
        variant_routes.parse([{"name": "base", "kind": "lora"}], "base")
    with pytest.raises(ValueError, match="runs on the foundation"):
        variant_routes.parse([{"name": "x", "kind": "lora", "replicas": ["r"]}])


def test_gateway_table_resolves_names_and_404s_name_the_served() -> None:
    t = gw_variants.VariantTable("base")
    t.update(
        [
            variant_routes.RouteVariant("legal", "lora"),
            variant_routes.RouteVariant("med", "full", ("r0-med",)),
        ]
    )
    assert t.names() == ["base", "legal", "med"]
    base, legal, med = t.resolve("base"), t.resolve("legal"), t.resolve("med")
    assert (base.variant, base.allows("r0"), base.allows("r0-med")) == ("", True, False)
    assert (legal.variant, legal.allows("r0"), legal.allows("r0-med")) == ("legal", True, False)
    assert (med.variant, med.allows("r0"), med.allows("r0-med")) == ("", False, True)
    with pytest.raises(gw_errors.ApiError) as info:
        request_params.check_model({"model": "nope"}, t.names())
    assert info.value.status == 404
    assert "`base`, `legal`, `med`" in info.value.message


def _placed(rid: str, idx: int, n: int, start: int, end: int) -> transition_model.Placed:
    b = blocks.Block("/base", start, end, replica_id=rid, stage_index=idx, num_stages=n)
    return transition_model.Placed(f"a{idx}", f"h:{idx}", b)


def test_full_chains_mirror_each_foundation_replica() -> None:
    rid = blocks.replica_id("ns", "dep", "r0", 3)
    target = transition_model.Target(
        3,
        (_placed(rid, 1, 2, 4, 8), _placed(rid, 0, 2, 0, 4)),
        (routes_doc.RouteReplica(rid, "h:0"),),
    )
    got = variant_plan.with_full_chains(target, [V("med", "full", "/med"), V("x", "lora", "/x")])
    chain = "ns.dep.r0-med.g3"
    assert [r.id for r in got.replicas] == [rid, chain]
    mine = [p for p in got.blocks if p.block.replica_id == chain]
    assert [(p.agent, p.block.model_path, p.block.start, p.block.end) for p in mine] == [
        ("a1", "/med", 4, 8),
        ("a0", "/med", 0, 4),
    ]
    assert blocks.parse_replica_id(chain).name == "r0-med"
    assert variant_plan.with_full_chains(target, [V("x", "lora", "/x")]) is target


def test_adapter_steps_remove_leader_first_and_add_leader_last() -> None:
    def held(idx: int, names: set[str]) -> variant_plan.HeldStage:
        return variant_plan.HeldStage(f"a{idx}", f"h:{idx}", "r0", idx, 2, frozenset(names))

    steps = variant_plan.adapter_steps([held(0, {"a", "b"}), held(1, {"a", "b"})], ["a", "c"])
    assert [(s.stage_index, s.names) for s in steps] == [
        (0, ("a",)),  # b stops on the leader first (it drains there)
        (1, ("a",)),
        (1, ("a", "c")),  # c reaches the follower before the leader admits it
        (0, ("a", "c")),
    ]
    assert variant_plan.adapter_steps([held(0, {"a"}), held(1, {"a"})], ["a"]) == []


def test_status_says_where_and_why() -> None:
    held = [
        variant_plan.HeldStage("a0", "h:0", "r0", 0, 2, frozenset({"legal"})),
        variant_plan.HeldStage("a1", "h:1", "r0", 1, 2, frozenset()),
    ]
    out = variant_plan.status(
        [V("legal", "lora", "/l"), V("bad", "lora", "/b"), V("med", "full", "/m")],
        held,
        {"med": ["r0-med"]},
        frozenset({"r0-med"}),
        {"bad": "INVALID_ARGUMENT: variant 'bad': r must be positive"},
    )
    legal, bad, med = out
    assert (legal.ready, legal.reason, legal.loaded_on) == (False, "Attaching", ("a0/r0/0",))
    assert (bad.ready, bad.reason) == (False, "InvalidAdapter") and "r must be" in bad.message
    assert (med.ready, med.reason, med.loaded_on) == (True, "Ready", ("r0-med",))


def test_validation_names_adapters_and_finetunes_that_do_not_fit(
    tiny_llama: Path, tmp_path: Path
) -> None:
    small = tiny_checkpoint.make_tiny(tmp_path / "small", tiny_checkpoint.TinySpec(hidden=128))
    good = tiny_variants.make_tiny_lora(tiny_llama, tmp_path / "good", r=4)
    wrong = tiny_variants.make_tiny_lora(small, tmp_path / "wrong", r=4)  # other shapes
    dora = tiny_variants.make_tiny_lora(tiny_llama, tmp_path / "dora", r=4)
    cfg = dora / "adapter_config.json"
    cfg.write_text(cfg.read_text().replace('"use_dora": false', '"use_dora": true'))
    variants = (
        V("good", "lora", str(good)),
        V("wrong", "lora", str(wrong)),
        V("dora", "lora", str(dora)),
        V("other", "full", str(small)),
        V("same", "full", str(tiny_llama)),
    )
    dep = SimpleNamespace(spec=SimpleNamespace(variants=variants))
    errs = variant_check.check(dep, str(tiny_llama))
    assert len(errs) == 3, errs
    assert errs[0].startswith("spec.variants[1].adapter: ") and "do not fit" in errs[0]
    assert errs[1].startswith("spec.variants[2].adapter: ") and "use_dora" in errs[1]
    assert errs[2].startswith("spec.variants[3].checkpoint: not the foundation's architecture")
