"""The `speculate` variant (issue 35): parsed, its layers and its surrogate in the zoo
checked by `tessera validate`, `tessera up`'s check and the operator's semantics (a block
before and after it; no refusal otherwise: it is served); the surrogate zoo's round trip,
pseudo entries included; `tessera model surrogate` writes the entry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera import api, api_semantics, fields, variant_spec
from tessera.cli import main as cli
from tessera.cost import model_shape

MANIFEST = """apiVersion: serving.tessera.dev/v1alpha1
kind: ServingDeployment
metadata:
  name: spec
spec:
  model: {{name: tiny, path: {model}, dtype: float32}}
  layout:
    mode: explicit
    replicas:
      - name: r0
        stages:
          - {{agent: agent-0, device: cpu:0, layers: [0, 2]}}
          - {{agent: agent-1, device: cpu:0, layers: [2, 4]}}
  variants:
    - name: quick
      speculate: {{layers: {layers}, zoo: {zoo}}}
"""


def _parse(entry: Any) -> tuple[variant_spec.VariantSpec, ...]:
    return variant_spec.parse([{"name": "quick", **entry}], "tiny")


def test_the_speculate_field_parses_and_refuses_bad_entries() -> None:
    (v,) = _parse({"speculate": {"layers": [1, 2], "zoo": "z"}})
    assert (v.kind, v.layers, v.zoo, v.path) == ("speculate", (1, 2), "z", "")
    assert v.to_json() == {"name": "quick", "speculate": {"layers": [1, 2], "zoo": "z"}}
    assert _parse(v.to_json()) == (v,)
    bad = {
        "spec.variants[0].speculate.zoo: is required": {"layers": [1, 2]},
        "spec.variants[0].speculate.layers: must be [a, b] with 0 <= a < b": {
            "layers": [2, 2],
            "zoo": "z",
        },
        "spec.variants[0].speculate.x: unknown field": {"layers": [1, 2], "zoo": "z", "x": 1},
    }
    for message, doc in bad.items():
        with pytest.raises(fields.FieldError) as err:
            _parse({"speculate": doc})
        assert str(err.value).startswith(message), str(err.value)
    with pytest.raises(fields.FieldError, match="exactly one of"):
        _parse({"speculate": {"layers": [1, 2], "zoo": "z"}, "checkpoint": "c"})
    with pytest.raises(fields.FieldError, match="full fine-tunes"):
        _parse({"speculate": {"layers": [1, 2], "zoo": "z"}, "shareEquivalent": True})


def test_refusals_name_the_field_and_the_reason() -> None:
    def why(layers: list[int]) -> list[str]:
        vs = _parse({"speculate": {"layers": layers, "zoo": "z"}})
        return [str(e) for e in variant_spec.refusals(vs, 4)]

    assert why([0, 1])[0].startswith("spec.variants[0].speculate.layers: [0, 1] must lie")
    assert "the last block's output cannot be corrected" in why([2, 4])[0]
    assert why([1, 2]) == []  # served (issue 35): no refusal
    # the operator checks it too (InvalidSpec only for the layers)
    doc = yaml.safe_load(MANIFEST.format(model="/m", layers="[1, 2]", zoo="z"))
    errs = api_semantics.check_semantics(
        api.parse(doc).spec, model_shape.ModelShape("m", 64, 128, 4, 4, 2, 100, 16)
    )
    assert errs == []
    doc = yaml.safe_load(MANIFEST.format(model="/m", layers="[1, 4]", zoo="z"))
    errs = api_semantics.check_semantics(
        api.parse(doc).spec, model_shape.ModelShape("m", 64, 128, 4, 4, 2, 100, 16)
    )
    assert [str(e) for e in errs] == why([1, 4])


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tessera_agent import tiny_checkpoint as tc

    path: Path = tmp_path_factory.mktemp("speculate") / "tiny"
    tc.make_tiny(path, tc.TinySpec(layers=4, hidden=64, heads=4, kv_heads=2, vocab=512))
    return path


def test_model_surrogate_writes_the_zoo_entry_validate_finds(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    from tessera_agent import surrogate_zoo

    zoo = tmp_path / "zoo"
    manifest = tmp_path / "m.yaml"

    def validate(layers: str) -> tuple[int, str]:
        manifest.write_text(MANIFEST.format(model=model, layers=layers, zoo=zoo))
        rc = cli.main(["validate", "-f", str(manifest)])
        return rc, capsys.readouterr().out

    rc, out = validate("[1, 2]")  # no surrogate yet
    assert rc == 1
    assert f"spec.variants[0].speculate: no surrogate in {zoo} for layers [1, 2]" in out
    assert "tessera model surrogate" in out

    argv = ["model", "surrogate", str(model), "--layers", "1", "2", "--zoo", str(zoo)]
    assert cli.main([*argv, "--rank", "8", "--sequences", "3"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["layers"] == [1, 2] and record["rank"] == 8
    assert -1.0 <= record["quality"]["cosine"] <= 1.0

    sur, meta = surrogate_zoo.open_zoo(zoo, model, (1, 2))
    assert meta["checkpoint"]["path"] == str(model)
    assert sur is not None and sur(torch.zeros(3, 64)).shape == (3, 64)
    with pytest.raises(LookupError, match="no surrogate"):
        surrogate_zoo.open_zoo(zoo, model, (2, 3))
    # a record that names another checkpoint is refused
    folder = surrogate_zoo.zoo_path(zoo, model, (1, 2))
    doc = json.loads((folder / "surrogate.json").read_text())
    doc["checkpoint"]["sha256"] = "0" * 64
    (folder / "surrogate.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="another checkpoint"):
        surrogate_zoo.open_zoo(zoo, model, (1, 2))
    (folder / "surrogate.json").write_text(json.dumps(meta))

    rc, out = validate("[1, 2]")  # found: valid
    assert rc == 0, out
    rc, out = validate("[2, 4]")
    assert rc == 1 and "the last block's output cannot be corrected" in out

    # `tessera up` runs the same check before it starts anything
    from tessera.cli import variant_check

    manifest.write_text(MANIFEST.format(model=model, layers="[1, 2]", zoo=zoo))
    dep = api.parse(yaml.safe_load(manifest.read_text()))
    assert variant_check.check(dep, str(model)) == []
    surrogate_zoo.save_pseudo(zoo, model, (1, 2), "half")  # the paper's pseudo surrogate
    sur, meta = surrogate_zoo.open_zoo(zoo, model, (1, 2))
    assert sur is None and meta["kind"] == "pseudo" and meta["wrong"] == "half"


def test_the_agent_refuses_a_speculated_block_it_cannot_serve(model: Path, tmp_path: Path) -> None:
    from tessera import blocks
    from tessera_agent import speculate_serve, surrogate_zoo
    from tessera_agent.engine import errors

    def block(start: int, end: int, stage: int, zoo: Path) -> blocks.Block:
        return blocks.Block(
            str(model), start, end, stage_index=stage, num_stages=3, speculate_zoo=str(zoo)
        )

    with pytest.raises(errors.NotFoundError, match="no surrogate"):
        speculate_serve.check(block(1, 2, 1, tmp_path / "empty"))
    with pytest.raises(errors.InvalidArgumentError, match="a stage before it"):
        speculate_serve.check(block(0, 1, 0, tmp_path / "empty"))
    with pytest.raises(errors.InvalidArgumentError, match="one after it"):
        speculate_serve.check(block(3, 4, 2, tmp_path / "empty"))
    surrogate_zoo.save_pseudo(tmp_path / "zoo", model, (1, 2), "never")
    sur, meta, folder = speculate_serve.check(block(1, 2, 1, tmp_path / "zoo"))
    assert sur is None and meta["kind"] == "pseudo" and folder.endswith("-1-2")
