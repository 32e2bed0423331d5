"""The operator's one Kubernetes API client besides kopf's own: plain dicts over REST.

Used by `discovery.py` (agent pods, nodes) and `gateway.py` (the gateway ConfigMap,
Deployment and Service). Credentials and TLS come from the `kubernetes` client's
configuration (in-cluster service account, else kubeconfig, else an explicit URL for
tests), so this module never parses them itself. The client is synchronous, so every call
runs in a worker thread and never blocks kopf's event loop. kopf's login handler
(`login()`) uses the same source, so both clients talk to the same server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import kopf
import kubernetes

USER_AGENT = "tessera-operator/0.1.0"


class KubeError(Exception):
    """A non-2xx answer: `status` is the HTTP code, `reason` the Status reason."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


def path(
    api_version: str, plural: str, namespace: str | None = None, name: str | None = None
) -> str:
    """`/api/v1/namespaces/ns/pods/name` or `/apis/apps/v1/...` for a resource."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespace:
        base += f"/namespaces/{quote(namespace)}"
    base += f"/{plural}"
    return f"{base}/{quote(name)}" if name else base


def _untyped(obj: object) -> Any:
    """The kubernetes client is partly annotated, and more so in each release: its calls go
    through Any so that no version-dependent `type: ignore` is needed (issue 28)."""
    return obj


def configuration(api_server: str = "") -> kubernetes.client.Configuration:
    """The client configuration: an explicit URL, else in-cluster, else kubeconfig."""
    if api_server:
        conf = kubernetes.client.Configuration(host=api_server)
        conf.verify_ssl = False
        return conf
    conf = kubernetes.client.Configuration()
    try:
        _untyped(kubernetes.config).load_incluster_config(client_configuration=conf)
    except kubernetes.config.ConfigException:
        _untyped(kubernetes.config).load_kube_config(client_configuration=conf)
    return conf


@dataclass
class Kube:
    """Async dict-in, dict-out calls; 404 on reads is None, other failures KubeError."""

    api: kubernetes.client.ApiClient
    timeout_s: float = 30.0

    @classmethod
    def connect(cls, api_server: str = "") -> Kube:
        api = kubernetes.client.ApiClient(configuration(api_server))
        api.user_agent = USER_AGENT
        return cls(api)

    def close(self) -> None:
        _untyped(self.api).close()

    def _call(
        self,
        method: str,
        url: str,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        req = self.api.param_serialize(
            method=method,
            resource_path=url,
            query_params=list(query),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.api.call_api(*req, _request_timeout=self.timeout_s)
        except kubernetes.client.ApiException as exc:
            raise KubeError(int(exc.status or 0), str(exc.reason), str(exc.body)) from exc
        data = _untyped(resp).read()
        doc = json.loads(data) if data else {}
        if resp.status >= 300:
            raise KubeError(resp.status, str(doc.get("reason", "")), str(doc.get("message", "")))
        return doc

    async def request(
        self,
        method: str,
        url: str,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        return await asyncio.to_thread(self._call, method, url, query, body, content_type)

    async def get(self, url: str) -> dict[str, Any] | None:
        try:
            doc: dict[str, Any] = await self.request("GET", url)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return doc

    async def list(
        self, url: str, label_selector: str = "", field_selector: str = ""
    ) -> list[dict[str, Any]]:
        query = [("labelSelector", label_selector)] if label_selector else []
        if field_selector:
            query.append(("fieldSelector", field_selector))
        doc = await self.request("GET", url, query)
        items: list[dict[str, Any]] = doc.get("items", [])
        return items

    async def create(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        doc: dict[str, Any] = await self.request("POST", url, body=body)
        return doc

    async def replace(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        doc: dict[str, Any] = await self.request("PUT", url, body=body)
        return doc

    async def merge_patch(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386) of `url`, e.g. an object's `/status`."""
        doc: dict[str, Any] = await self.request(
            "PATCH", url, body=body, content_type="application/merge-patch+json"
        )
        return doc


def login(api_server: str, logger: kopf.Logger, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's credentials: the explicit URL when given, else what the `kubernetes` client
    would use (in-cluster service account or kubeconfig)."""
    if api_server:
        return kopf.ConnectionInfo(server=api_server, insecure=True)
    return kopf.login_via_client(logger=logger, **kwargs)
