"""What a dashboard query reads: metric names and label names, for the checks against a scrape.

Not a PromQL parser: the dashboards' queries are selectors, `rate`/`increase`/`changes`,
`sum by (...)`, `count by (...)`, `histogram_quantile` and arithmetic, which these regular
expressions cover; a query they cannot read fails the lint (`names` finds no metric).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

METRIC = re.compile(r"\b(tessera_[a-z0-9_]+)\b")
SELECTOR = re.compile(r"\b(tessera_[a-z0-9_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
LABEL_VALUES = re.compile(r"label_values\(\s*(tessera_[a-z0-9_]+)\s*,\s*(\w+)\s*\)")


def names(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


def selector_labels(expr: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for metric, body in SELECTOR.findall(expr):
        out.setdefault(metric, set()).update(m[0] for m in MATCHER.findall(body))
    return out


def grouping_labels(expr: str) -> set[str]:
    out: set[str] = set()
    for body in GROUPING.findall(expr):
        out.update(x.strip() for x in body.split(",") if x.strip())
    return out


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def exported(text: str, declared: dict[str, tuple[str, ...]] | None = None) -> dict[str, set[str]]:
    """Sample name -> label names, from a Prometheus text exposition. A labelled metric no
    event has touched yet shows only its HELP and TYPE lines: its samples' names are then
    derived from its type and its label names taken from `declared` (family name -> label
    names, from the declaring module)."""
    out: dict[str, set[str]] = {}
    declared = declared or {}
    for fam in text_string_to_metric_families(text):
        names = [fam.name, *(fam.name + x for x in SUFFIXES.get(fam.type, ()))]
        for name in names:
            out.setdefault(name, set())
        if not fam.samples:
            extra = set(declared.get(fam.name, ()))
            for name in names:
                out[name] |= extra | ({"le"} if name.endswith("_bucket") else set())
        for s in fam.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def declared_labels(registry: Any) -> dict[str, tuple[str, ...]]:
    """Family name -> label names of every metric object in a prometheus_client registry
    (`_labelnames`: the library keeps them there)."""
    out: dict[str, tuple[str, ...]] = {}
    for collector in list(getattr(registry, "_collector_to_names", {})):
        labels = getattr(collector, "_labelnames", None)
        name = getattr(collector, "_name", None)
        if labels is not None and name:
            out[str(name)] = tuple(labels)
    return out


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, expr) of every query: panels, variables, annotations."""
    for p in dashboard["panels"]:
        for t in p["targets"]:
            yield f"panel {p['title']!r}", t["expr"]
    for v in dashboard["templating"]["list"]:
        q = v.get("query")
        if isinstance(q, dict):
            yield f"variable {v['name']}", q["query"]
    for a in dashboard["annotations"]["list"]:
        if "expr" in a:
            yield f"annotation {a['name']!r}", a["expr"]


def problems(
    dashboard: dict[str, Any], seen: dict[str, set[str]], target_labels: tuple[str, ...]
) -> list[str]:
    """Every query's metrics and labels that the scrape `seen` does not have."""
    out: list[str] = []
    for where, expr in queries(dashboard):
        metrics = names(expr)
        if not metrics:
            out.append(f"{dashboard['uid']} {where}: no tessera metric in {expr!r}")
        for m in sorted(metrics - set(seen)):
            out.append(f"{dashboard['uid']} {where}: {m} is not exported")
        known = set(target_labels) | {"le"}
        for m in metrics & set(seen):
            known |= seen[m]
        for m, labels in selector_labels(expr).items():
            for label in sorted(labels - seen.get(m, set()) - set(target_labels)):
                out.append(f"{dashboard['uid']} {where}: {m} has no label {label!r}")
        for label in sorted(grouping_labels(expr) - known):
            out.append(f"{dashboard['uid']} {where}: no metric of {expr!r} has {label!r}")
        for m, label in LABEL_VALUES.findall(expr):
            if label not in seen.get(m, set()) | set(target_labels):
                out.append(f"{dashboard['uid']} {where}: {m} has no label {label!r}")
    return out
