"""Grafana's dashboard JSON model, the parts Tessera's dashboards use: panels with
Prometheus targets, the datasource/job/deployment variables, one annotation stream per
control loop. Used by `dashboards.py` (what each dashboard shows). Pure: builds dicts.
"""

from __future__ import annotations

from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39
TARGET_LABELS = ("job", "instance", "namespace", "pod", "service")  # added by Prometheus
REPLICA = 'replica=~"$deployment.*"'


def query(expr: str, legend: str, ref: str = "A") -> dict[str, Any]:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref}


def panel(
    pid: int,
    title: str,
    targets: list[tuple[str, str]],
    x: int,
    y: int,
    unit: str = "short",
    kind: str = "timeseries",
    w: int = 12,
    h: int = 8,
    description: str = "",
) -> dict[str, Any]:
    return {
        "id": pid,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom"}},
        "targets": [query(e, leg, chr(ord("A") + i)) for i, (e, leg) in enumerate(targets)],
    }


def variables(deployment: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {
            "name": "datasource",
            "type": "datasource",
            "query": "prometheus",
            "label": "Prometheus",
        },
        {
            "name": "job",
            "type": "query",
            "label": "gateway (one per deployment)",
            "datasource": DATASOURCE,
            "query": {"query": "label_values(tessera_gateway_requests_total, job)", "refId": "V"},
            "definition": "label_values(tessera_gateway_requests_total, job)",
            "includeAll": True,
            "multi": True,
            "refresh": 2,
        },
    ]
    if deployment:
        out.append(
            {
                "name": "deployment",
                "type": "query",
                "label": "deployment (namespace.name)",
                "datasource": DATASOURCE,
                "query": {
                    "query": "label_values(tessera_agent_kv_pages_total, replica)",
                    "refId": "V",
                },
                "definition": "label_values(tessera_agent_kv_pages_total, replica)",
                "regex": "/^([^.]+\\.[^.]+)\\..*/",
                "includeAll": True,
                "allValue": ".*",
                "refresh": 2,
            }
        )
    return out


def annotation_streams() -> list[dict[str, Any]]:
    """One annotation stream per control loop: a mark wherever the loop acted."""
    out: list[dict[str, Any]] = [
        {
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        }
    ]
    colours = {
        "transition": "blue",
        "overload": "red",
        "scaling": "purple",
        "switching": "orange",
        "wake": "green",
    }
    for loop, colour in colours.items():
        out.append(
            {
                "name": f"{loop} actions",
                "datasource": DATASOURCE,
                "enable": True,
                "iconColor": colour,
                "expr": f'changes(tessera_control_last_action_timestamp_seconds{{loop="{loop}"}}'
                "[1m]) > 0",
                "step": "30s",
                "titleFormat": f"{loop}",
                "textFormat": "{{loop}} action",
            }
        )
    return out


def dashboard(
    uid: str, title: str, panels: list[dict[str, Any]], deployment: bool
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "tags": ["tessera"],
        "timezone": "browser",
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": variables(deployment)},
        "annotations": {"list": annotation_streams()},
        "panels": panels,
    }


def quantiles(metric: str, by: str, where: str = 'job=~"$job"') -> list[tuple[str, str]]:
    return [
        (
            f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{where}}}[5m])))",
            f"p{int(q * 100)} {{{{{by.replace(', ', '}} {{')}}}}}",
        )
        for q in (0.5, 0.9, 0.99)
    ]
