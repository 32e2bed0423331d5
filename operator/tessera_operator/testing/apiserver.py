"""A stateful Kubernetes API server for tests and benches: KMock's emulator, made stricter.

Used by `tests/operator/` and `tessera bench reconcile` (through `background.py`) to run
the real operator against something that behaves like an API server. On `store.Store`
(stamped objects, watch replay, selectors) this adds what the operator and kopf 1.45 need:
* create with `generateName`; `generation` bumped on spec changes only;
* merge-patch (RFC 7386), JSON-patch (RFC 6902, with `test`: a failed test answers 422),
  strategic-merge-patch (as a merge patch) and PUT (409 on a stale resourceVersion);
  no-op writes change nothing and emit no watch event;
* the `status` subresource isolated from the main resource, both ways;
* deletion with finalizers (deletionTimestamp, gone when the last finalizer leaves);
* custom resources defaulted, pruned and validated against their CRD's schema (422);
* every resource request of the operator recorded as (verb, apiGroup, resource), which
  the tests compare with `tests/operator/rbac_usage.json` (`rbac_usage`).
"""

from __future__ import annotations

import collections
import copy
import re
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
from kmock._internal import apps, rendering

from tessera import crd as crd_schema
from tessera_operator.testing import rbac_usage, store

OPERATOR_AGENTS = ("kopf/", "tessera-operator/")  # User-Agent prefixes of the operator

# (resource key, kind, namespaced, subresources) of the built-in resources served.
BUILTINS: tuple[tuple[str, str, bool, tuple[str, ...]], ...] = (
    ("v1/namespaces", "Namespace", False, ()),
    ("v1/nodes", "Node", False, ()),
    ("v1/pods", "Pod", True, ("status",)),
    ("v1/events", "Event", True, ()),
    ("v1/configmaps", "ConfigMap", True, ()),
    ("v1/services", "Service", True, ("status",)),
    ("apps/v1/deployments", "Deployment", True, ("status",)),
    ("cert-manager.io/v1/certificates", "Certificate", True, ("status",)),  # cert-manager's
    ("apiextensions.k8s.io/v1/customresourcedefinitions", "CustomResourceDefinition", False, ()),
)
VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")
_CLUSTER = "-"  # placeholder namespace of the rewritten cluster-scoped namespace paths
_NAMESPACES_RE = re.compile(r"^/api/v1/namespaces(/[^/]+)?/?$")
CRDS = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")


def _spec_of(body: Mapping[str, Any]) -> dict[str, Any]:
    """Everything but metadata and status: what `generation` counts changes of."""
    return {k: v for k, v in body.items() if k not in ("metadata", "status")}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


@attrs.define(kw_only=True)
class ApiServer(store.Store):
    """The emulator with the fixes listed in the module docstring.

    `crds` are CRD manifests: each becomes a served resource (kind, names, scope,
    subresources) validated against its schema, and an object under
    `customresourcedefinitions`."""

    crds: list[dict[str, Any]] = attrs.field(factory=list)
    operator_agents: tuple[str, ...] = OPERATOR_AGENTS
    usage: set[tuple[str, str, str]] = attrs.field(factory=set, init=False)
    counts: collections.Counter[tuple[str, str, str]] = attrs.field(
        factory=collections.Counter, init=False
    )  # the operator's resource requests by (verb, apiGroup, resource)
    _schemas: dict[kmock.resource, dict[str, Any]] = attrs.field(factory=dict, init=False)
    _status_sub: set[kmock.resource] = attrs.field(factory=set, init=False)
    _replies: dict[int, dict[str, Any]] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for key, kind, namespaced, subs in BUILTINS:
            self._declare(kmock.resource(key), kind, namespaced, subs, (), ())
        for doc in self.crds:
            spec, names = doc["spec"], doc["spec"]["names"]
            for version in spec["versions"]:
                res = kmock.resource(spec["group"], version["name"], names["plural"])
                subs = tuple(version.get("subresources", {}))
                self._declare(
                    res,
                    names["kind"],
                    spec["scope"] == "Namespaced",
                    subs,
                    names.get("shortNames", ()),
                    names.get("categories", ()),
                )
                self._schemas[res] = version["schema"]["openAPIV3Schema"]
            self._put(CRDS, None, doc["metadata"]["name"], self._stamp(copy.deepcopy(doc), None))
        self.fallback[kmock.method.PUT] << self._serve_update

    def _declare(
        self,
        res: kmock.resource,
        kind: str,
        namespaced: bool,
        subs: tuple[str, ...],
        short: Iterable[str],
        categories: Iterable[str],
    ) -> None:
        self.resources[res] = kmock.ResourceInfo(
            kind=kind,
            namespaced=namespaced,
            singular=kind.lower(),
            verbs=set(VERBS),
            shortnames=set(short),
            categories=set(categories),
            subresources=set(subs),
        )
        self._kinds[res] = kind
        self._namespaced[res] = namespaced
        if "status" in subs:
            self._status_sub.add(res)

    # -- recording -------------------------------------------------------------------

    def _record(self, request: kmock.Request) -> None:
        agent = request.headers.get("User-Agent", "")
        if not agent.startswith(self.operator_agents) or request.resource is None:
            return
        plural = str(request.resource.plural)
        if request.subresource:
            plural += f"/{request.subresource}"
        key = (rbac_usage.verb(request), str(request.resource.group), plural)
        self.usage.add(key)
        self.counts[key] += 1

    # -- dispatch --------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # KMock's path parser reads `/api/v1/namespaces[/NAME]` as a namespace prefix with
        # nothing after it (and answers 500): present it as a namespaced path instead.
        m = _NAMESPACES_RE.match(raw_request.path)
        if m:
            path = f"/api/v1/namespaces/{_CLUSTER}/namespaces{m.group(1) or ''}"
            raw_request = raw_request.clone(rel_url=raw_request.rel_url.with_path(path))
        return await super().__call__(raw_request)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        rewritten = request.namespace == _CLUSTER
        if rewritten:
            request = attrs.evolve(request, namespace=None)
        res = request.resource
        if res is None or res.plural is None:
            return await super()._handle(request)  # discovery
        self._record(request)
        if res not in self._kinds:
            raise store.ApiError(
                404, "NotFound", f"the server could not find resource {store.key(res)}"
            )
        if request.namespace is not None and not self._namespaced[res]:
            raise store.ApiError(404, "NotFound", f"{store.key(res)} is not namespaced")
        method = request.method.value
        async with self._lock:
            if method == "POST" and request.name is None:
                self._replies[id(request)] = await self._create(request)
            elif method == "PATCH" and request.name is not None:
                self._replies[id(request)] = await self._write(request, self._patched)
            elif method == "PUT" and request.name is not None:
                self._replies[id(request)] = await self._write(request, self._replaced)
            elif method == "DELETE" and request.name is not None:
                self._replies[id(request)] = await self._delete(request)
        if rewritten:  # KMock's reactions cannot match the rewritten request: serve it here
            return await rendering.Response(payload=self._serve_rewritten(request))(request)
        # Past KubernetesEmulator's own (naive) mutations: straight to reactions/fallbacks.
        return await apps.RawHandler._handle(self, request)

    def _serve_rewritten(self, request: kmock.Request) -> kmock.Payload:
        verb = rbac_usage.verb(request)
        if verb == "watch":
            return self._serve_watch(request)
        if verb in ("get", "list"):
            return (self._serve_fetch if verb == "get" else self._serve_list)(request)
        return self._replies.pop(id(request))

    async def _serve_create(self, request: kmock.Request) -> kmock.Payload:
        return rendering.Response(status=201, payload=self._replies.pop(id(request)))

    async def _serve_update(self, request: kmock.Request) -> kmock.Payload:
        return self._replies.pop(id(request))

    async def _serve_delete(self, request: kmock.Request) -> kmock.Payload:
        return self._replies.pop(id(request))

    # -- validation ------------------------------------------------------------------

    def _admit(self, res: kmock.resource, body: dict[str, Any]) -> dict[str, Any]:
        """Defaults, pruning and schema validation of a custom resource (422 if invalid)."""
        schema = self._schemas.get(res)
        if schema is None:
            return body
        body, _ = crd_schema.prune(crd_schema.apply_defaults(body, schema), schema)
        errors = crd_schema.validate(body, schema)
        if errors:
            name = (body.get("metadata") or {}).get("name", "")
            causes = [
                {
                    "reason": "FieldValueInvalid",
                    "message": f"Invalid value: {e.message}",
                    "field": e.path,
                }
                for e in errors
            ]
            raise store.ApiError(
                422,
                "Invalid",
                f'{self._kinds[res]}.{res.group} "{name}" is invalid: '
                + "; ".join(str(e) for e in errors),
                {"name": name, "group": res.group, "kind": self._kinds[res], "causes": causes},
            )
        return body

    # -- verbs -----------------------------------------------------------------------

    async def _create(self, request: kmock.Request) -> dict[str, Any]:
        res = request.resource
        assert res is not None
        if request.subresource:
            raise store.ApiError(405, "MethodNotAllowed", "create on a subresource")
        if not isinstance(request.data, dict):
            raise store.ApiError(400, "BadRequest", "the body must be a JSON object")
        body = copy.deepcopy(request.data)
        meta = body.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise store.ApiError(422, "Invalid", "metadata.name: Required value")
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        ns = self._namespace_of(request, body)
        if ns is not None:
            meta["namespace"] = ns
        if self._get(res, ns, meta["name"]) is not None:
            raise store.ApiError(
                409, "AlreadyExists", f'{store.key(res)} "{meta["name"]}" already exists'
            )
        if res in self._status_sub:
            body.pop("status", None)
        for key in ("resourceVersion", "uid", "generation", "deletionTimestamp"):
            meta.pop(key, None)
        body = self._stamp(self._admit(res, body), None)
        self._put(res, ns, meta["name"], body)
        await self._emit(res, "ADDED", body)
        return body

    def _patched(self, request: kmock.Request, old: dict[str, Any]) -> dict[str, Any]:
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
        if ctype == "application/json-patch+json":
            try:
                result: dict[str, Any] = jsonpatch.apply_patch(old, request.data)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise store.ApiError(422, "Invalid", f"the JSON patch failed: {exc}") from exc
            return result
        if ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            patched: dict[str, Any] = merge_patch(old, request.data)
            return patched
        raise store.ApiError(415, "UnsupportedMediaType", f"unsupported patch type {ctype!r}")

    def _replaced(self, request: kmock.Request, old: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(request.data, dict):
            raise store.ApiError(400, "BadRequest", "the body must be a JSON object")
        want = (request.data.get("metadata") or {}).get("resourceVersion")
        have = old["metadata"]["resourceVersion"]
        if want and want != have:
            raise store.ApiError(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on {store.key(request.resource)} "  # type: ignore[arg-type]
                f'"{request.name}": the object has been modified (resourceVersion {want} '
                f"!= {have})",
            )
        return copy.deepcopy(request.data)

    async def _write(self, request: kmock.Request, change: Any) -> dict[str, Any]:
        res = request.resource
        assert res is not None and request.name is not None
        ns = request.namespace if self._namespaced[res] else None
        old = self._get(res, ns, request.name)
        if old is None:
            raise store.ApiError(404, "NotFound", f'{store.key(res)} "{request.name}" not found')
        new = change(request, old)
        if request.subresource == "status":
            new = (
                dict(old, status=new.get("status"))
                if new.get("status") is not None
                else {k: v for k, v in old.items() if k != "status"}
            )
        elif request.subresource:
            raise store.ApiError(404, "NotFound", f"subresource {request.subresource} not served")
        elif res in self._status_sub:
            new = {k: v for k, v in new.items() if k != "status"}
            if "status" in old:
                new["status"] = old["status"]
        meta = new.setdefault("metadata", {})
        for key in (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "generation",
            "resourceVersion",
        ):
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
            else:
                meta.pop(key, None)
        new = self._admit(res, new)
        meta = new["metadata"]
        if new == old:
            return old  # a no-op write changes nothing, not even the resourceVersion
        if _spec_of(new) != _spec_of(old):
            meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        new = self._stamp(new, old)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._put(res, ns, request.name, new)
            self.objects[(res, ns, request.name)].delete()
            await self._emit(res, "DELETED", new)
            return new
        self._put(res, ns, request.name, new)
        await self._emit(res, "MODIFIED", new)
        return new

    async def _delete(self, request: kmock.Request) -> dict[str, Any]:
        res = request.resource
        assert res is not None and request.name is not None
        ns = request.namespace if self._namespaced[res] else None
        old = self._get(res, ns, request.name)
        if old is None:
            raise store.ApiError(404, "NotFound", f'{store.key(res)} "{request.name}" not found')
        meta = old["metadata"]
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = store.now()
                meta["deletionGracePeriodSeconds"] = 0
                old = self._stamp(old, old)
                self._put(res, ns, request.name, old)
                await self._emit(res, "MODIFIED", old)
            return old
        old = self._stamp(old, old)
        self.objects[(res, ns, request.name)].delete()
        await self._emit(res, "DELETED", old)
        return old
