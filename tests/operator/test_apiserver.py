"""The KMock test API server behaves like a real one where the operator and kopf rely on it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from tessera_operator.testing import background

SD = "/apis/serving.tessera.dev/v1alpha1/namespaces/default/servingdeployments"
MERGE, JSONPATCH = "application/merge-patch+json", "application/json-patch+json"


def call(
    srv: background.ApiServerThread,
    method: str,
    path: str,
    body: Any = None,
    ctype: str = "application/json",
    agent: str = "tessera-tests/0",
) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        srv.url + path,
        data=data,
        method=method,
        headers={"Content-Type": ctype, "User-Agent": agent},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def sd(name: str = "a", port: int = 8000) -> dict[str, Any]:
    return {
        "apiVersion": "serving.tessera.dev/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": "m", "path": "/m"}, "gateway": {"port": port}},
        "status": {"phase": "Ready"},
    }


def test_create_sets_metadata_defaults_and_drops_status(
    api_server: background.ApiServerThread,
) -> None:
    code, obj = call(api_server, "POST", SD, sd())
    assert code == 201
    meta = obj["metadata"]
    assert meta["generation"] == 1 and meta["uid"] and meta["creationTimestamp"]
    assert int(meta["resourceVersion"]) > 0 and meta["namespace"] == "default"
    assert "status" not in obj  # the status subresource owns it
    assert obj["spec"]["gateway"] == {"port": 8000, "serviceType": "ClusterIP", "replicas": 1}
    assert call(api_server, "POST", SD, sd())[0] == 409
    code, ev = call(
        api_server,
        "POST",
        "/api/v1/namespaces/default/events",
        {"metadata": {"generateName": "x-"}, "reason": "R"},
    )
    assert code == 201 and ev["metadata"]["name"].startswith("x-")


def test_schema_violations_answer_422_with_causes(api_server: background.ApiServerThread) -> None:
    code, status = call(api_server, "POST", SD, sd(port=70000))
    assert (code, status["reason"], status["kind"]) == (422, "Invalid", "Status")
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "field": "spec.gateway.port",
            "message": "Invalid value: 70000 is greater than the maximum of 65535",
        }
    ]
    assert 'ServingDeployment.serving.tessera.dev "a" is invalid' in status["message"]
    call(api_server, "POST", SD, sd())
    code, status = call(api_server, "PATCH", f"{SD}/a", {"spec": {"gateway": {"port": 0}}}, MERGE)
    assert code == 422 and status["details"]["causes"][0]["field"] == "spec.gateway.port"
    code, obj = call(api_server, "PATCH", f"{SD}/a", {"spec": {"bogus": 1}}, MERGE)
    assert code == 200 and "bogus" not in obj["spec"]  # unknown fields are pruned


def test_status_is_isolated_and_generation_counts_spec_changes(
    api_server: background.ApiServerThread,
) -> None:
    _, obj = call(api_server, "POST", SD, sd())
    rv = obj["metadata"]["resourceVersion"]
    _, obj = call(api_server, "PATCH", f"{SD}/a", {"status": {"phase": "Ready"}}, MERGE)
    assert "status" not in obj and obj["metadata"]["resourceVersion"] == rv  # no-op
    _, obj = call(
        api_server,
        "PATCH",
        f"{SD}/a/status",
        {"status": {"phase": "Ready"}, "spec": {"gateway": {"port": 1}}},
        MERGE,
    )
    assert obj["status"] == {"phase": "Ready"} and obj["spec"]["gateway"]["port"] == 8000
    assert obj["metadata"]["generation"] == 1 and obj["metadata"]["resourceVersion"] != rv
    _, obj = call(api_server, "PATCH", f"{SD}/a", {"metadata": {"annotations": {"k": "v"}}}, MERGE)
    assert obj["metadata"]["generation"] == 1 and obj["status"] == {"phase": "Ready"}
    _, obj = call(api_server, "PATCH", f"{SD}/a", {"spec": {"gateway": {"port": 9}}}, MERGE)
    assert obj["metadata"]["generation"] == 2
    _, obj = call(api_server, "PATCH", f"{SD}/a/status", {"status": {"phase": None}}, MERGE)
    assert obj["status"] == {}


def test_json_patch_test_op_and_put_concurrency(api_server: background.ApiServerThread) -> None:
    _, obj = call(api_server, "POST", SD, sd())
    rv = obj["metadata"]["resourceVersion"]
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "0"},
        {"op": "add", "path": "/metadata/finalizers", "value": ["f"]},
    ]
    assert call(api_server, "PATCH", f"{SD}/a", ops, JSONPATCH)[0] == 422
    ops[0]["value"] = rv
    code, obj = call(api_server, "PATCH", f"{SD}/a", ops, JSONPATCH)
    assert code == 200 and obj["metadata"]["finalizers"] == ["f"]
    stale = dict(obj, metadata=dict(obj["metadata"], resourceVersion=rv))
    assert call(api_server, "PUT", f"{SD}/a", stale)[0] == 409
    code, obj = call(api_server, "PUT", f"{SD}/a", obj)
    assert code == 200

    # deletion waits for the finalizers
    code, obj = call(api_server, "DELETE", f"{SD}/a")
    assert code == 200 and obj["metadata"]["deletionTimestamp"]
    assert call(api_server, "GET", f"{SD}/a")[0] == 200
    call(api_server, "PATCH", f"{SD}/a", {"metadata": {"finalizers": None}}, MERGE)
    assert call(api_server, "GET", f"{SD}/a")[0] == 404


def test_selectors_namespaces_and_recorded_usage(api_server: background.ApiServerThread) -> None:
    for name, comp, node in (("p1", "agent", "n1"), ("p2", "agent", "n2"), ("p3", "gw", "n1")):
        call(
            api_server,
            "POST",
            "/api/v1/namespaces/ns/pods",
            {
                "metadata": {"name": name, "labels": {"app.kubernetes.io/component": comp}},
                "spec": {"nodeName": node},
            },
        )
    path = "/api/v1/namespaces/ns/pods?labelSelector=app.kubernetes.io/component%3Dagent"
    _, found = call(api_server, "GET", path, agent="kopf/1.45")
    assert [p["metadata"]["name"] for p in found["items"]] == ["p1", "p2"]
    _, found = call(api_server, "GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1")
    assert [p["metadata"]["name"] for p in found["items"]] == ["p1", "p3"]
    _, found = call(
        api_server,
        "GET",
        "/api/v1/pods?labelSelector=app.kubernetes.io/component%20notin%20(agent),!missing",
    )
    assert [p["metadata"]["name"] for p in found["items"]] == ["p3"]
    assert call(api_server, "GET", "/api/v1/namespaces")[0] == 200
    assert api_server.usage() == {("list", "", "pods")}  # only the operator's requests


@pytest.mark.parametrize("since_first", [True, False])
def test_watch_replays_events_after_a_resource_version(
    api_server: background.ApiServerThread, since_first: bool
) -> None:
    _, first = call(api_server, "POST", SD, sd("a"))
    call(api_server, "PATCH", f"{SD}/a", {"spec": {"gateway": {"port": 9}}}, MERGE)
    call(api_server, "POST", SD, sd("b"))
    rv = first["metadata"]["resourceVersion"] if since_first else ""
    url = f"{api_server.url}{SD}?watch=true&timeoutSeconds=1&resourceVersion={rv}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        lines = [json.loads(x) for x in resp.read().splitlines() if x.strip()]
    seen = [(e["type"], e["object"]["metadata"]["name"]) for e in lines]
    if since_first:
        assert seen == [("MODIFIED", "a"), ("ADDED", "b")]
    else:
        assert seen == [("ADDED", "a"), ("ADDED", "b")]
