"""Storage and reads of the test API server: objects, resourceVersions, watch events.

`Store` is KMock's `KubernetesEmulator` with the objects stamped (one global
resourceVersion counter, `uid`, `creationTimestamp`, `generation`), every change logged
for watches from a resourceVersion, and get, list and watch served with label and field
selectors (`selectors`). `ApiError` is answered as a `Status` object. `apiserver.ApiServer`
builds on it (writes, admission, recording); used only by tests and benches.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import attrs
import kmock

from tessera_operator.testing import selectors


class ApiError(kmock.KubernetesError):
    """An error answered as a `Status` object (reason as a real server spells it)."""


def now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def key(res: kmock.resource) -> str:
    return f"{res.group}/{res.plural}" if res.group else str(res.plural)


@attrs.define(kw_only=True)
class Store(kmock.KubernetesEmulator):
    """Stamped objects, their change log, and the read verbs."""

    _rv: int = attrs.field(default=0, init=False)
    _log: dict[kmock.resource, list[tuple[int, dict[str, Any]]]] = attrs.field(
        factory=dict, init=False
    )
    _kinds: dict[kmock.resource, str] = attrs.field(factory=dict, init=False)
    _namespaced: dict[kmock.resource, bool] = attrs.field(factory=dict, init=False)

    # -- storage ---------------------------------------------------------------------

    def _get(self, res: kmock.resource, ns: str | None, name: str) -> dict[str, Any] | None:
        key = (res, ns, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def _put(self, res: kmock.resource, ns: str | None, name: str, body: dict[str, Any]) -> None:
        key = (res, ns, name)
        if key in self.objects:
            self.objects[key].history.append(body)
        else:
            self.objects[key] = body

    def _stamp(self, body: dict[str, Any], old: Mapping[str, Any] | None) -> dict[str, Any]:
        self._rv += 1
        meta = body.setdefault("metadata", {})
        meta["resourceVersion"] = str(self._rv)
        if old is None:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now()
            meta["generation"] = 1
        return body

    async def _emit(self, res: kmock.resource, kind: str, body: dict[str, Any]) -> None:
        event = {"type": kind, "object": copy.deepcopy(body)}
        self._log.setdefault(res, []).append((self._rv, event))
        await self._buses[res].put(event)

    def _namespace_of(self, request: kmock.Request, body: Mapping[str, Any]) -> str | None:
        assert request.resource is not None
        if not self._namespaced[request.resource]:
            return None
        return request.namespace or (body.get("metadata") or {}).get("namespace") or "default"

    # -- reads -----------------------------------------------------------------------

    def _matcher(self, request: kmock.Request) -> selectors.Matcher:
        label = selectors.labels(request.params.get("labelSelector", ""))
        try:
            field = selectors.fields(request.params.get("fieldSelector", ""))
        except ValueError as exc:
            raise ApiError(400, "BadRequest", str(exc)) from exc
        return lambda obj: label(obj) and field(obj)

    def _visible(self, request: kmock.Request, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        if request.namespace is not None and meta.get("namespace") != request.namespace:
            return False
        return request.name is None or meta.get("name") == request.name

    async def _serve_fetch(self, request: kmock.Request) -> kmock.Payload:
        res = request.resource
        assert res is not None and request.name is not None
        obj = self._get(res, request.namespace, request.name)
        if obj is None:
            raise ApiError(404, "NotFound", f'{key(res)} "{request.name}" not found')
        return obj

    async def _serve_list(self, request: kmock.Request) -> kmock.Payload:
        res = request.resource
        assert res is not None
        match = self._matcher(request)
        async with self._lock:
            items = [
                copy.deepcopy(obj.raw)
                for (r, _, _), obj in self.objects.items()
                if r == res and not obj.deleted
            ]
            rv = self._rv
        items = [o for o in items if self._visible(request, o) and match(o)]
        items.sort(key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))
        return {
            "apiVersion": f"{res.group}/{res.version}".lstrip("/"),
            "kind": f"{self._kinds[res]}List",
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[kmock.Payload]:
        res = request.resource
        assert res is not None
        match = self._matcher(request)
        since = int(request.params.get("resourceVersion") or 0)
        timeout = float(request.params.get("timeoutSeconds") or 0) or None
        yield b""  # send the headers now: the stream is open even if nothing happens
        async with self._lock:
            if since:
                backlog = [ev for rv, ev in self._log.get(res, []) if rv > since]
            else:
                backlog = [
                    {"type": "ADDED", "object": copy.deepcopy(obj.raw)}
                    for (r, _, _), obj in self.objects.items()
                    if r == res and not obj.deleted
                ]
            mark = await self._buses[res].mark()
        try:
            async with asyncio.timeout(timeout):
                for event in backlog:
                    if self._visible(request, event["object"]) and match(event["object"]):
                        yield event
                async for event in self._buses[res].stream(since=mark):
                    if self._visible(request, event["object"]) and match(event["object"]):
                        yield event
        except TimeoutError:
            return
        finally:
            await self._buses[res].unmark(mark)
