"""Fuzzing ServingDeployment manifests (hypothesis) through `tessera validate` and the
operator's reconcile pass: never a crash; a rejected manifest is reported with a field path,
and the operator always writes a Ready condition with a reason (InvalidSpec, ...).

Manifests are a valid one with random subtrees replaced, deleted or retyped, plus wholly
random documents. The operator pass is the one `reconciler._pass` runs, with no agents
(`converge` observes none) and no API server: parse, semantic checks, plan, status.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera import api, crd, fields
from tessera.cli import validate_cmd
from tessera.control import converge, outcome
from tessera_operator import status

EXAMPLES = 150
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _base(model: Path) -> dict[str, Any]:
    return {
        "apiVersion": "serving.tessera.dev/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": "fuzz", "namespace": "default", "generation": 1},
        "spec": {
            "model": {"name": "tiny-llama", "path": str(model), "dtype": "float32"},
            "layout": {
                "mode": "explicit",
                "kvCacheBytes": 16 << 20,
                "replicas": [
                    {"name": "r0", "stages": [{"agent": "a", "device": "cpu:0", "layers": [0, 8]}]}
                ],
            },
            "slo": {"ttftP99Ms": 2000, "tpotP99Ms": 200},
            "gateway": {"port": 8000, "replicas": 1},
        },
    }


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def manifests(draw: st.DrawFn, model: Path) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(JSON)  # anything at all
    doc = _base(model)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(JSON)
    return doc


def _operator_pass(raw: Any) -> dict[str, Any]:
    """What the operator writes for `raw`: `reconciler._pass` minus the Kubernetes I/O."""
    try:
        dep = api.parse(copy.deepcopy(raw))
    except fields.FieldError as exc:
        out = outcome.Outcome("InvalidSpec", str(exc), errors=[exc])
    else:
        path = converge.resolve_model_path(dep.spec, None, "/models")
        out = asyncio.run(converge.converge(dep, path, [], apply=False, tls=None))
    return status.build(out, 1, {}, "2026-01-01T00:00:00Z", "")


@pytest.fixture(scope="module")
def counter() -> dict[str, int]:
    return {"cases": 0, "rejected": 0}


def test_fuzzed_manifests_never_crash_and_always_get_a_reason(
    tiny_llama: Path, counter: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    schema = crd.version_schema(crd.load())
    args = argparse.Namespace(model_root="/models", no_model_check=False, agent=[])
    reasons: dict[str, int] = {}

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(manifests(tiny_llama))
    def check(doc: Any) -> None:
        counter["cases"] += 1
        errors, _ = validate_cmd.check_document(doc, tiny_llama.parent, schema, args)
        assert all(isinstance(e, str) and e for e in errors)
        st_ = _operator_pass(doc)
        ready = status.condition(st_, "Ready")
        assert ready["status"] in ("True", "False") and ready["reason"], st_
        if ready["status"] == "False":
            assert ready["message"], st_
            counter["rejected"] += 1
        reasons[ready["reason"]] = reasons.get(ready["reason"], 0) + 1

    check()
    with capsys.disabled():
        print(
            f"\nfuzz manifests: {counter['cases']} cases tried, {counter['rejected']} got "
            f"Ready=False with a reason, none crashed; {dict(sorted(reasons.items()))}"
        )
    assert counter["cases"] >= EXAMPLES // 2
