"""The chart's files, without helm: the CRD copy, the values schema, Chart.yaml, the tools.

The chart ships `crds/` byte for byte (Helm installs the chart's copy; the top-level folder
is the source of truth). values.yaml and ci/all-on-values.yaml must satisfy
values.schema.json, which helm also enforces at install time.
"""

from __future__ import annotations

import copy
import json
import os
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.chart import chart_check

ROOT = chart_check.ROOT
CHART = chart_check.CHART


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return schema


def _values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's values merge: maps merge recursively, everything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def test_chart_crds_are_a_byte_identical_copy_of_the_top_level_crds() -> None:
    top = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert "servingdeployments.serving.tessera.dev.yaml" in top
    assert sorted(chart) == sorted(top), "charts/tessera/crds/ must hold exactly crds/*.yaml"
    stale = [name for name in top if chart[name] != top[name]]
    assert not stale, f"stale chart copies (cp crds/*.yaml charts/tessera/crds/): {stale}"


def test_values_schema_is_draft7_and_closed() -> None:
    schema = _schema()
    jsonschema.Draft7Validator.check_schema(schema)
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["additionalProperties"] is False
    for group in ("operator", "agent", "gateway", "metrics", "networkPolicy", "modelCache"):
        assert schema["properties"][group]["additionalProperties"] is False, group


@pytest.mark.parametrize("overrides", [None, "ci/all-on-values.yaml"])
def test_values_satisfy_the_schema(overrides: str | None) -> None:
    values = _values()
    if overrides:
        values = _merge(values, yaml.safe_load((CHART / overrides).read_text()))
    jsonschema.Draft7Validator(_schema()).validate(values)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("agent", "bogus"), 1),  # unknown key
        (("agent", "image", "tag"), "latest"),
        (("agent", "gpu", "count"), -1),
        (("modelCache", "type"), "nfs"),
        (("gateway", "service", "type"), "ExternalName"),
        (("operator", "replicas"), 0),
        (("operator", "watchNamespaces"), ["Not_A_Namespace"]),
    ],
)
def test_schema_rejects_bad_values(path: tuple[str, ...], value: object) -> None:
    values = _values()
    node = values
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(_schema()).validate(values)


def test_pvc_model_cache_requires_a_claim_name() -> None:
    values = _merge(_values(), {"modelCache": {"type": "pvc"}})
    with pytest.raises(jsonschema.ValidationError, match=r"claimName|minLength"):
        jsonschema.Draft7Validator(_schema()).validate(values)


def test_every_component_has_the_standard_value_groups() -> None:
    values = _values()
    for component in ("operator", "agent", "gateway"):
        group = values[component]
        for key in ("image", "resources", "tolerations", "affinity", "nodeSelector"):
            assert key in group, f"{component}.{key}"
        assert "serviceAccount" in group, component
        assert set(group["image"]) >= {"repository", "tag", "pullPolicy"}, component
        assert group["image"]["tag"] == "", f"{component}: tag defaults to appVersion"
        assert group["podSecurityContext"]["runAsNonRoot"] is True, component
        assert group["podSecurityContext"]["runAsUser"] == 10001, component
        assert group["securityContext"]["capabilities"]["drop"] == ["ALL"], component
        assert group["securityContext"]["allowPrivilegeEscalation"] is False, component
        assert group["securityContext"]["readOnlyRootFilesystem"] is True, component


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == project["version"] == "0.1.0"
    assert chart["kubeVersion"].startswith(">=1.27")
    assert chart["description"] and chart["keywords"]


def test_tool_fetchers_are_executable_and_their_folder_is_ignored() -> None:
    for script in ("fetch-helm.sh", "fetch-hadolint.sh"):
        path: Path = ROOT / "scripts" / script
        assert os.access(path, os.X_OK), script
    assert ".tools/" in (ROOT / ".gitignore").read_text().splitlines()
