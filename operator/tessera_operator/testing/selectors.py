"""Label and field selectors as the Kubernetes API evaluates them on list and watch.

Used by the KMock test API server (`apiserver.py`) to filter `?labelSelector=` and
`?fieldSelector=` requests; KMock itself ignores them. Supports the label operators
`=`, `==`, `!=`, `in (...)`, `notin (...)`, `key` and `!key`, and field selectors on
any dotted path (`metadata.name`, `spec.nodeName`, `involvedObject.name`) with `=`,
`==` and `!=`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Matcher = Callable[[Mapping[str, Any]], bool]

_SET_RE = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split(selector: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _label_term(term: str) -> Callable[[Mapping[str, str]], bool]:
    m = _SET_RE.match(term)
    if m:
        key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    for op in ("!=", "==", "="):
        if op in term:
            key, _, value = (s.strip() for s in term.partition(op))
            if op == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: labels.get(key) == value
    if term.startswith("!"):
        key = term[1:].strip()
        return lambda labels: key not in labels
    return lambda labels: term in labels


def labels(selector: str) -> Matcher:
    """A predicate over objects for a `labelSelector` string."""
    terms = [_label_term(t) for t in _split(selector)]

    def match(obj: Mapping[str, Any]) -> bool:
        found = (obj.get("metadata") or {}).get("labels") or {}
        return all(t(found) for t in terms)

    return match


def _lookup(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for key in path.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def field_terms(selector: str) -> list[tuple[str, str, str]]:
    """(path, op, value) of each term of a `fieldSelector`."""
    out = []
    for term in _split(selector):
        for op in ("!=", "==", "="):
            if op in term:
                path, _, value = (s.strip() for s in term.partition(op))
                out.append((path, "!=" if op == "!=" else "=", value))
                break
        else:
            raise ValueError(f"field selector term {term!r}: expected path=value")
    return out


def fields(selector: str) -> Matcher:
    """A predicate over objects for a `fieldSelector` string (ValueError if malformed)."""
    terms = field_terms(selector)

    def match(obj: Mapping[str, Any]) -> bool:
        return all((_lookup(obj, p) == v) == (op == "=") for p, op, v in terms)

    return match
