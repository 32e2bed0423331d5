"""Manifest parsing and semantic checks name the field and the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera import api, api_semantics, fields
from tessera.cost import model_shape

ROOT = Path(__file__).resolve().parents[2]
SHAPE_8_LAYERS = model_shape.ModelShape("m", 64, 128, 8, 4, 2, 100, 16)


def _doc(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": {"name": "m", "path": "p"}}
    base.update(spec)
    return {
        "apiVersion": "serving.tessera.dev/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": "demo"},
        "spec": base,
    }


def test_local_example_parses() -> None:
    dep = api.parse(yaml.safe_load((ROOT / "examples/local-tiny.yaml").read_text()))
    assert dep.spec.layout.mode == "explicit"
    assert [len(r.stages) for r in dep.spec.layout.replicas] == [1, 2]
    assert dep.spec.gateway.port == 8000 and not dep.spec.policies.overload.enabled


@pytest.mark.parametrize(
    "spec, path",
    [
        ({"gateway": {"port": 70000}}, "spec.gateway.port"),
        ({"model": {"name": "m"}}, "spec.model.path"),
        ({"model": {"name": "m", "path": "p", "dtype": "int3"}}, "spec.model.dtype"),
        ({"layout": {"mode": "explicit"}}, "spec.layout.replicas"),
        (
            {
                "layout": {
                    "mode": "explicit",
                    "replicas": [{"stages": [{"agent": "a", "layers": [4, 2]}]}],
                }
            },
            "spec.layout.replicas[0].stages[0].layers",
        ),
        ({"layout": {"mode": "sideways"}}, "spec.layout.mode"),
        ({"slo": {"ttftP99Ms": -1}}, "spec.slo.ttftP99Ms"),
        (
            {"workload": {"classes": [{"name": "a", "inputTokens": 0, "outputTokens": 1}]}},
            "spec.workload.classes[0].inputTokens",
        ),
        ({"policies": {"overload": {"enabled": "yes"}}}, "spec.policies.overload.enabled"),
        ({"surprise": 1}, "spec.surprise"),
    ],
)
def test_structural_errors_name_the_field(spec: dict[str, Any], path: str) -> None:
    with pytest.raises(fields.FieldError) as info:
        api.parse(_doc(**spec))
    assert info.value.path == path


def test_semantic_errors_name_the_field() -> None:
    dep = api.parse(
        _doc(
            layout={
                "mode": "explicit",
                "replicas": [
                    {"stages": [{"agent": "a0", "layers": [0, 8]}]},
                    {"stages": [{"agent": "a0", "layers": [0, 12]}]},
                    {
                        "stages": [
                            {"agent": "a0", "layers": [0, 3]},
                            {"agent": "ghost", "layers": [4, 8]},
                        ]
                    },
                    {"stages": [{"agent": "a0", "layers": [0, 8], "tp": 3}]},
                    {
                        "stages": [
                            {
                                "agent": "a0",
                                "layers": [0, 8],
                                "tp": 2,
                                "ranks": [{"agent": "ghost2"}],
                            }
                        ]
                    },
                    {"stages": [{"agent": "a0", "layers": [0, 8], "tp": 2}]},
                    {
                        "stages": [
                            {
                                "agent": "a0",
                                "layers": [0, 8],
                                "tp": 2,
                                "ranks": [{"agent": "a0", "device": "cpu:0"}],
                            }
                        ]
                    },
                ],
            }
        )
    )
    errs = [str(e) for e in api_semantics.check_semantics(dep.spec, SHAPE_8_LAYERS, ["a0"])]
    assert "spec.layout.replicas[1].stages[0].layers: end 12 exceeds the model's 8 layers" in errs
    assert any(
        e.startswith("spec.layout.replicas[2].stages[1].layers: starts at layer 4") for e in errs
    )
    assert any(
        e.startswith("spec.layout.replicas[2].stages[1].agent: unknown agent 'ghost'") for e in errs
    )
    assert any(
        e.startswith("spec.layout.replicas[3].stages[0].tp: 3 does not divide") for e in errs
    )
    assert any(
        e.startswith("spec.layout.replicas[4].stages[0].ranks[0].agent: unknown agent 'ghost2'")
        for e in errs
    )
    # tp=2 on a0's cpu:0 and cpu:1: one agent holds both ranks, one device per rank
    assert not any("replicas[5]" in e for e in errs)
    assert any(  # both ranks on a0's cpu:0: one device per rank
        e.startswith("spec.layout.replicas[6].stages[0].ranks: the 2 tensor-parallel ranks need")
        for e in errs
    )
    assert not any("replicas[0]" in e for e in errs)


def test_tp_ranks_are_placed() -> None:
    st = api.StageSpec("a0", "cuda:2", (0, 8), tp=2)
    assert [(r.agent, r.device) for r in st.placements()] == [("a0", "cuda:2"), ("a0", "cuda:3")]
    st = api.StageSpec("a0", "cpu:0", (0, 8), tp=2, ranks=(api.RankSpec("a1", "cpu:0"),))
    assert [(r.agent, r.device) for r in st.placements()] == [("a0", "cpu:0"), ("a1", "cpu:0")]
    with pytest.raises(fields.FieldError, match="needs 1"):
        api.parse(
            _doc(
                layout={
                    "mode": "explicit",
                    "replicas": [
                        {
                            "stages": [
                                {
                                    "agent": "a0",
                                    "layers": [0, 8],
                                    "tp": 2,
                                    "ranks": [{"agent": "a1"}, {"agent": "a2"}],
                                }
                            ]
                        }
                    ],
                }
            )
        )
