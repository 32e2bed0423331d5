"""Fixtures of the operator tests: the KMock test API server, a Kubernetes client, the operator.

The API server and the operator each run in a thread of their own
(`tessera_operator.testing.background`). Every request the operator makes is recorded as
(verb, apiGroup, resource); at the end of the session the union is compared with
`rbac_usage.json` (the source of the Helm chart's ClusterRole), or written to it when
`TESSERA_UPDATE_RBAC_USAGE=1`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.control import agents
from tessera.policies.security import admission
from tessera_operator import config
from tessera_operator.testing import background
from tessera_operator.testing import rbac_usage as rbac_rules

RBAC_FILE = Path(__file__).with_name("rbac_usage.json")
GROUP, VERSION, PLURAL = "serving.tessera.dev", "v1alpha1", "servingdeployments"


@pytest.fixture(scope="session")
def rbac_usage() -> Iterator[set[tuple[str, str, str]]]:
    """Union of the operator's API requests over the session, checked at its end."""
    seen: set[tuple[str, str, str]] = set()
    yield seen
    if not seen:
        return
    if os.environ.get("TESSERA_UPDATE_RBAC_USAGE") == "1":
        RBAC_FILE.write_text(rbac_rules.dumps_usage(seen))
        return
    committed = {
        (r["verb"], r["apiGroup"], r["resource"]) for r in json.loads(RBAC_FILE.read_text())
    }
    missing = sorted(seen - committed)
    assert not missing, (
        f"the operator made requests not listed in {RBAC_FILE.name}: {missing}; "
        "rerun with TESSERA_UPDATE_RBAC_USAGE=1 and update the chart's ClusterRole"
    )


@pytest.fixture
def api_server(rbac_usage: set[tuple[str, str, str]]) -> Iterator[background.ApiServerThread]:
    srv = background.ApiServerThread().start()
    try:
        yield srv
    finally:
        rbac_usage.update(srv.usage())
        srv.stop()


@pytest.fixture
def kube(api_server: background.ApiServerThread) -> Iterator[client.ApiClient]:
    """A client as a user would have (kubectl-like), not recorded as the operator."""
    api = client.ApiClient(client.Configuration(host=api_server.url))
    api.user_agent = "tessera-tests/0"
    yield api
    api.close()


@pytest.fixture
def start_operator(
    api_server: background.ApiServerThread,
) -> Iterator[Callable[..., background.OperatorThread]]:
    """`start_operator(refs, **config)`: run the operator; stopped at the end of the test."""
    running: list[background.OperatorThread] = []

    def start(refs: list[agents.AgentRef], **kwargs: Any) -> background.OperatorThread:
        kwargs.setdefault("resync_seconds", 1.0)
        # tests serve checkpoints from temporary folders, mounted by hostPath
        kwargs.setdefault("admission", admission.Limits(("/",), allow_host_path=True))
        cfg = config.OperatorConfig(agents=tuple(refs), api_server=api_server.url, **kwargs)
        op = background.OperatorThread(cfg).start()
        running.append(op)
        return op

    yield start
    for op in running:
        if op.alive:
            op.stop()


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 60.0, every: float = 0.1) -> Any:
    """Poll `fn` until it returns something truthy; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def custom(kube: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube)


def create(kube: client.ApiClient, doc: dict[str, Any], ns: str = "default") -> Any:
    """Create the ServingDeployment `doc` in `ns` (what `kubectl apply` does first)."""
    return custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, doc)


def get_sd(kube: client.ApiClient, name: str, ns: str = "default") -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = custom(kube).get_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, name
        )
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return obj


def condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return dict(c)
    return {}


def events(kube: client.ApiClient, name: str, ns: str = "default") -> list[tuple[str, str]]:
    """(reason, message) of the events about object `name`, oldest first."""
    found = client.CoreV1Api(kube).list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name}"
    )
    items = sorted(found.items, key=lambda e: int(e.metadata.resource_version))
    return [(e.reason or "", e.message or "") for e in items]
