"""The Grafana dashboards: current with their generator, schema-valid, and lint-clean; the
chart ships them as sidecar ConfigMaps only when asked. (Their queries are checked against
a live scrape in `test_live_up.py`.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tessera.observability import dashboards, dashboards_loops
from tests.observability import promql

ROOT = Path(__file__).resolve().parents[2]

# The part of Grafana's dashboard model (schemaVersion 39) these files use, strictly typed.
TARGET = {
    "type": "object",
    "required": ["datasource", "expr", "refId", "legendFormat"],
    "properties": {
        "expr": {"type": "string", "minLength": 1},
        "refId": {"type": "string", "pattern": "^[A-Z]$"},
        "legendFormat": {"type": "string"},
        "datasource": {"$ref": "#/$defs/datasource"},
    },
    "additionalProperties": False,
}
PANEL = {
    "type": "object",
    "required": ["id", "type", "title", "gridPos", "targets", "datasource", "fieldConfig"],
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "type": {"enum": ["timeseries", "table", "stat", "gauge", "bargauge"]},
        "title": {"type": "string", "minLength": 1},
        "description": {"type": "string"},
        "datasource": {"$ref": "#/$defs/datasource"},
        "gridPos": {
            "type": "object",
            "required": ["x", "y", "w", "h"],
            "properties": {
                "x": {"type": "integer", "minimum": 0, "maximum": 23},
                "y": {"type": "integer", "minimum": 0},
                "w": {"type": "integer", "minimum": 1, "maximum": 24},
                "h": {"type": "integer", "minimum": 1},
            },
            "additionalProperties": False,
        },
        "fieldConfig": {"type": "object", "required": ["defaults"]},
        "options": {"type": "object"},
        "targets": {"type": "array", "minItems": 1, "items": TARGET},
    },
    "additionalProperties": False,
}
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$defs": {
        "datasource": {
            "type": "object",
            "required": ["type", "uid"],
            "properties": {"type": {"const": "prometheus"}, "uid": {"const": "${datasource}"}},
        }
    },
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "annotations", "time"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"},
        "title": {"type": "string"},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "panels": {"type": "array", "minItems": 1, "items": PANEL},
        "templating": {
            "type": "object",
            "properties": {
                "list": {
                    "type": "array",
                    "items": {"type": "object", "required": ["name", "type"]},
                }
            },
        },
        "annotations": {"type": "object", "required": ["list"]},
        "time": {"type": "object", "required": ["from", "to"]},
    },
}


def _all() -> dict[str, dict[str, Any]]:
    return {name: make() for name, make in dashboards.ALL.items()}


@pytest.mark.parametrize("folder", ["charts/tessera/dashboards", "docs/dashboards"])
def test_committed_dashboards_are_what_the_generator_makes(folder: str) -> None:
    want = dashboards.rendered()
    have = {p.name: p.read_text() for p in (ROOT / folder).glob("*.json")}
    assert have == want, (
        f"{folder} is stale: run `python -m tessera.observability.dashboards` at the root"
    )


def test_dashboards_pass_the_schema_and_the_lint() -> None:
    found: list[str] = []
    uids = set()
    for name, d in _all().items():
        jsonschema.validate(d, SCHEMA)
        assert d["uid"] not in uids, name
        uids.add(d["uid"])
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        cells: set[tuple[int, int]] = set()
        for p in d["panels"]:
            g = p["gridPos"]
            assert g["x"] + g["w"] <= 24, f"{name} {p['title']}: wider than the grid"
            mine = {
                (x, y)
                for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])
            }
            assert not cells & mine, f"{name} {p['title']}: overlaps another panel"
            cells |= mine
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs)), f"{name} {p['title']}: duplicate refIds"
        defined = {v["name"] for v in d["templating"]["list"]}
        text = json.dumps(d)
        used = set(re.findall(r"\$\{?([a-z_]+)", text)) - {"schema"}
        assert used <= defined, f"{name}: undefined variables {used - defined}"
        for where, expr in promql.queries(d):
            if not promql.names(expr):
                found.append(f"{name} {where}: no tessera metric in {expr!r}")
            if expr.count("(") != expr.count(")") or expr.count("{") != expr.count("}"):
                found.append(f"{name} {where}: unbalanced brackets in {expr!r}")
            for m in promql.names(expr):
                if m.endswith("_bucket"):
                    assert "histogram_quantile" in expr, f"{name} {where}: raw buckets"
    assert not found, "\n".join(found)


def test_the_elasticity_dashboard_annotates_every_control_loop_that_acts() -> None:
    d = dashboards_loops.elasticity()
    loops = {a["name"].split()[0] for a in d["annotations"]["list"] if "expr" in a}
    assert loops == {"transition", "overload", "scaling", "switching", "wake"}


def test_the_chart_ships_the_dashboards_as_sidecar_config_maps_only_when_enabled() -> None:
    from tests.chart import chart_check as cc

    try:
        helm = cc.helm_binary()
    except Exception as exc:  # no network and no helm on disk
        pytest.skip(f"helm unavailable: {exc}")
    off = cc.template(helm, [], [])
    assert not [o for o in off if "dashboard" in o["metadata"]["name"]]
    on = cc.template(
        helm, [], ["dashboards.enabled=true", "dashboards.annotations.grafana_folder=T"]
    )
    maps = [o for o in on if o["kind"] == "ConfigMap" and "-dashboard-" in o["metadata"]["name"]]
    assert sorted(m["metadata"]["name"].split("-dashboard-")[1] for m in maps) == [
        "capacity",
        "control-plane",
        "elasticity",
        "serving",
    ]
    for m in maps:
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert m["metadata"]["annotations"] == {"grafana_folder": "T"}
        ((fname, text),) = m["data"].items()
        assert json.loads(text) == json.loads(dashboards.rendered()[fname])
    assert not cc.validate_objects(on, "1.30.0")
