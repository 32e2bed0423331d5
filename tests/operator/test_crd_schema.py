"""The CRD schema and `tessera.api` agree: same fields, same defaults, same examples.

Fields are compared by walking both: the schema's properties, and the allowed keys
`api.parse` checks at each object (recorded while it parses a manifest that sets every
field the schema declares). Every top-level `examples/*.yaml` ServingDeployment
validates against the schema and parses. `tessera validate` reports fields by path.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera import api, crd, fields
from tessera.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = crd.version_schema(crd.load())
SPEC = SCHEMA["properties"]["spec"]


def _sample(schema: dict[str, Any], path: str) -> Any:
    """A valid value for every field of `schema` (lists get one item)."""
    if "properties" in schema:
        return {k: _sample(v, f"{path}.{k}") for k, v in schema["properties"].items()}
    if schema.get("type") == "array":
        n = schema.get("minItems", 1)
        return [_sample(schema["items"], f"{path}[]") for _ in range(n)]
    if "enum" in schema:
        return schema["enum"][-1]
    kind = schema.get("type") or "string"
    if path.endswith(".layers[]"):
        return 0
    return {
        "string": "x" if "pattern" not in schema else "a1",
        "integer": max(1, schema.get("minimum", 1)),
        "number": schema.get("default", schema["maximum"]) if "maximum" in schema else 1.5,
        "boolean": True,
        "object": {"k": "v"},
    }[kind]


def full_manifest() -> dict[str, Any]:
    spec = _sample(SPEC, "spec")
    spec["layout"]["mode"] = "explicit"
    spec["layout"]["replicas"][0]["stages"][0]["layers"] = [0, 4]
    spec["layout"]["replicas"][0]["stages"][0]["tp"] = 2  # so its one sampled rank is valid
    spec["resources"]["gpuMemory"] = "80Gi"
    spec["resources"]["maxGpus"] = spec["resources"]["gpus"] = 2
    # a variant is an adapter or a checkpoint; shareEquivalent applies to checkpoints
    del spec["variants"][0]["adapter"]
    # a stitched chain (issue 35) is a variant of its own
    spec["variants"].append({"name": "b2", "stitch": spec["variants"][0].pop("stitch")})
    # so is a speculated model (issue 35); its bottleneck block is a non-empty range
    spec["variants"].append({"name": "b3", "speculate": spec["variants"][0].pop("speculate")})
    spec["variants"][2]["speculate"]["layers"] = [1, 2]
    return {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.KIND,
        "metadata": {"name": "full"},
        "spec": spec,
    }


def _schema_objects(schema: dict[str, Any], path: str = "spec") -> dict[str, set[str]]:
    """path -> property names, for every object with properties (list items as [0])."""
    out: dict[str, set[str]] = {}
    if "properties" in schema:
        out[path] = set(schema["properties"])
        for k, v in schema["properties"].items():
            out.update(_schema_objects(v, f"{path}.{k}"))
    if schema.get("type") == "array" and "properties" in schema.get("items", {}):
        out.update(_schema_objects(schema["items"], f"{path}[0]"))
    return out


def test_every_field_agrees_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, set[str]] = {}
    real = fields.known_only

    def record(doc: Any, allowed: Any, path: str) -> None:
        seen[re.sub(r"\[\d+\]", "[0]", path)] = set(allowed)
        real(doc, allowed, path)

    monkeypatch.setattr(fields, "known_only", record)
    doc = full_manifest()
    assert crd.validate(doc, SCHEMA) == []
    api.parse(doc)  # accepts every field the schema declares
    schema_objects = _schema_objects(SPEC)
    assert seen == schema_objects


def _defaults(schema: dict[str, Any], path: str = "spec") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p, sub in crd.walk(schema, path):
        if "default" in sub and sub["default"] != {}:
            out[p] = sub["default"]
    return out


def _attr(obj: Any, camel_path: str) -> Any:
    """The parsed value at a schema path (`spec.gateway.serviceType` -> .gateway.service_type)."""
    for part in camel_path.split(".")[1:]:
        part = part.removesuffix("[]")
        obj = getattr(obj, re.sub(r"(?<!^)([A-Z])", r"_\1", part).lower())
        if isinstance(obj, tuple):
            obj = obj[0]
    return obj


def test_schema_defaults_are_the_parser_defaults() -> None:
    minimal = {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.KIND,
        "metadata": {"name": "m"},
        "spec": {
            "model": {"name": "m", "path": "/m"},
            "layout": {
                "mode": "explicit",
                "replicas": [{"stages": [{"agent": "a", "layers": [0, 1]}]}],
            },
            "workload": {"classes": [{"name": "c", "inputTokens": 1, "outputTokens": 1}]},
            "resources": {},
            "slo": {},
        },
    }
    parsed = api.parse(minimal).spec
    defaulted = api.parse(crd.apply_defaults(minimal, SCHEMA)).spec
    assert parsed == defaulted
    defaults = _defaults(SPEC)
    assert "spec.gateway.port" in defaults and "spec.layout.replicas[].stages[].tp" in defaults
    bare = api.parse(dict(minimal, spec={"model": {"name": "m", "path": "/m"}})).spec
    ranked: dict[str, Any] = copy.deepcopy(minimal)
    ranked["spec"]["layout"]["replicas"][0]["stages"][0].update(tp=2, ranks=[{"agent": "b"}])
    with_rank = api.parse(crd.apply_defaults(ranked, SCHEMA)).spec
    for path, value in defaults.items():
        source = parsed if "[]" in path else bare  # list items come from the minimal doc
        if ".ranks[]." in path:  # rank items exist only on a stage with tp > 1
            source = with_rank
        assert _attr(source, path.replace("workload.classes", "workload")) == value, path


def _examples() -> list[Path]:
    return sorted(
        p
        for p in (ROOT / "examples").glob("*.yaml")
        if (yaml.safe_load(p.read_text()) or {}).get("kind") == api.KIND
    )


def test_examples_cover_local_and_two_gpu_layouts() -> None:
    names = {p.name for p in _examples()}
    assert {"local-tiny.yaml", "gpu-2node-explicit.yaml", "gpu-2node-auto.yaml"} <= names


@pytest.mark.parametrize("path", _examples(), ids=lambda p: p.name)
def test_example_validates_and_parses(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert crd.validate(doc, SCHEMA) == []
    assert crd.prune(doc, SCHEMA)[1] == []
    dep = api.parse(crd.apply_defaults(doc, SCHEMA))
    assert dep == api.parse(doc)


def test_schema_errors_name_the_field() -> None:
    doc = full_manifest()
    doc["spec"]["gateway"]["port"] = 70000
    doc["spec"]["layout"]["replicas"][0]["stages"][0]["layers"] = [0]
    doc["spec"]["model"]["dtype"] = "int4"
    errs = [str(e) for e in crd.validate(doc, SCHEMA)]
    assert errs == [
        "spec.gateway.port: 70000 is greater than the maximum of 65535",
        "spec.layout.replicas[0].stages[0].layers: [0] is too short",
        "spec.model.dtype: 'int4' is not one of ['auto', 'float32', 'bfloat16', 'float16']",
    ]


def _validate(tmp_path: Path, doc: dict[str, Any], *extra: str) -> int:
    f = tmp_path / "sd.yaml"
    f.write_text(yaml.safe_dump(doc))
    return cli.main(["validate", "-f", str(f), *extra])


def test_validate_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = str(ROOT / "examples" / "models")
    for name in ("gpu-2node-explicit.yaml", "gpu-2node-auto.yaml"):
        assert (
            cli.main(["validate", "-f", str(ROOT / "examples" / name), "--model-root", models]) == 0
        )
    assert "ok: ServingDeployment serving/llama2-13b " in capsys.readouterr().out

    doc = yaml.safe_load((ROOT / "examples" / "gpu-2node-explicit.yaml").read_text())
    bad = copy.deepcopy(doc)
    bad["spec"]["gateway"]["port"] = 70000
    bad["spec"]["extra"] = 1
    assert _validate(tmp_path, bad, "--model-root", models) == 1
    out = capsys.readouterr().out
    assert "spec.gateway.port: 70000 is greater than the maximum of 65535" in out
    assert "spec.extra: unknown field" in out

    deep = copy.deepcopy(doc)
    deep["spec"]["layout"]["replicas"][3]["stages"][1]["layers"] = [20, 44]
    assert _validate(tmp_path, deep, "--model-root", models) == 1
    assert "spec.layout.replicas[3].stages[1].layers: end 44 exceeds the model's 40 layers" in (
        capsys.readouterr().out
    )
    # the model must be readable, unless told not to check it
    assert _validate(tmp_path, doc, "--model-root", str(tmp_path)) == 1
    assert "spec.model.pvc: model not readable" in capsys.readouterr().out
    assert _validate(tmp_path, doc, "--model-root", str(tmp_path), "--no-model-check") == 0
    auto = copy.deepcopy(doc)
    auto["spec"]["layout"]["mode"] = "auto"
    assert _validate(tmp_path, auto, "--no-model-check") == 1
    assert "spec.layout.replicas: must be empty when mode is auto" in capsys.readouterr().out


def test_field_error_paths_match_api_style() -> None:
    err = crd.validate({"spec": {"model": {"name": "m"}}}, SCHEMA)
    assert [e.path for e in err] == ["spec.model"]
    assert isinstance(err[0], fields.FieldError)
