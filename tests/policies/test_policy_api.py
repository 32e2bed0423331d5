"""`spec.policies.overload` and `spec.policies.scaling`: parsing, reasons, CRD defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera import api, fields

ROOT = Path(__file__).resolve().parents[2]


def _doc(policies: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "serving.tessera.dev/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": "demo"},
        "spec": {"model": {"name": "m", "path": "p"}, "policies": policies},
    }


def test_policies_parse_with_values_and_defaults() -> None:
    dep = api.parse(
        _doc(
            {
                "overload": {"enabled": True, "dropThreshold": 0.8, "restoreThreshold": 0.4},
                "scaling": {"enabled": True, "upIdleFraction": 0.6, "batchStep": 2},
            }
        )
    )
    ov, sc = dep.spec.policies.overload, dep.spec.policies.scaling
    assert ov.enabled and ov.drop_threshold == 0.8 and ov.restore_threshold == 0.4
    assert sc.enabled and sc.up_idle_fraction == 0.6 and sc.batch_step == 2
    assert sc.down_violation_rate == 0.05 and sc.max_migrations == 4
    assert not api.parse(_doc({})).spec.policies.overload.enabled


@pytest.mark.parametrize(
    "policies, path, words",
    [
        ({"overload": {"dropThreshold": 1.5}}, "spec.policies.overload.dropThreshold", "(0, 1]"),
        (
            {"overload": {"dropThreshold": 0.5, "restoreThreshold": 0.6}},
            "spec.policies.overload.restoreThreshold",
            "below dropThreshold",
        ),
        ({"overload": {"restore": 0.3}}, "spec.policies.overload.restore", ""),
        ({"scaling": {"upIdleFraction": 1.0}}, "spec.policies.scaling.upIdleFraction", "[0, 1)"),
        ({"scaling": {"downViolationRate": -0.1}}, "spec.policies.scaling.downViolationRate", ""),
        ({"scaling": {"batchStep": 0}}, "spec.policies.scaling.batchStep", ""),
        ({"scaling": {"evictAfterSeconds": 0}}, "spec.policies.scaling.evictAfterSeconds", "> 0"),
    ],
)
def test_bad_policy_fields_name_field_and_reason(
    policies: dict[str, Any], path: str, words: str
) -> None:
    with pytest.raises(fields.FieldError) as info:
        api.parse(_doc(policies))
    assert info.value.path == path and words in str(info.value)


def test_crd_defaults_match_the_dataclasses() -> None:
    crd = yaml.safe_load((ROOT / "crds/servingdeployments.serving.tessera.dev.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    pol = spec["properties"]["policies"]["properties"]
    dflt = api.PoliciesSpec()
    names = {
        "overload": {"dropThreshold": "drop_threshold", "restoreThreshold": "restore_threshold"},
        "scaling": {
            "upIdleFraction": "up_idle_fraction",
            "downViolationRate": "down_violation_rate",
            "batchStep": "batch_step",
            "maxMigrations": "max_migrations",
            "evictAfterSeconds": "evict_after_seconds",
        },
    }
    for section, keys in names.items():
        props = pol[section]["properties"]
        assert set(props) == {"enabled", *keys}
        for key, attr in keys.items():
            assert props[key]["default"] == getattr(getattr(dflt, section), attr), key
