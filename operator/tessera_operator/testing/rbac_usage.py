"""The operator's resource requests as RBAC rules: the verb of a request and the rules file.

`verb` names a request's verb as RBAC does (get, list, watch, create, patch, update,
delete, deletecollection); `usage_rules` and `dumps_usage` write the (verb, apiGroup,
resource) set `apiserver.ApiServer` records in the `tests/operator/rbac_usage.json`
format (the chart's RBAC source). Called by `apiserver` and `tests/operator/conftest.py`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import kmock


def verb(request: kmock.Request) -> str:
    """The verb of a request, as RBAC names it."""
    method = str(request.method.value)
    if method == "GET":
        if request.params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if request.name else "list"
    if method == "DELETE":
        return "delete" if request.name else "deletecollection"
    return {"POST": "create", "PATCH": "patch", "PUT": "update"}.get(method, method.lower())


def usage_rules(usage: Iterable[tuple[str, str, str]]) -> list[dict[str, str]]:
    """The recorded (verb, apiGroup, resource) set in the `rbac_usage.json` format."""
    return [
        {"apiGroup": g, "resource": r, "verb": v}
        for v, g, r in sorted(set(usage), key=lambda t: (t[1], t[2], t[0]))
    ]


def dumps_usage(usage: Iterable[tuple[str, str, str]]) -> str:
    return json.dumps(usage_rules(usage), indent=2) + "\n"
