"""The agent's authorization interceptor: caller role per RPC, its deployment, the model root.

Built by `tessera_agent.server` when it makes the gRPC server; decisions come from the pure
`policies.security.access` (role per method, model root) and `policies.security.tenancy`
(a gateway certificate's URI SAN binds it to one deployment or namespace, checked against
the owner of every replica a call names, including the ImportKV header and each GenerateMux
start). The caller's role is the Organizational Unit (OU) of the client certificate that
mutual TLS already verified against the deployment's CA (the transport refuses any other
client before a call reaches here). On a plaintext server (loopback `tessera up`) there is
no identity: every method is open, but the model root still holds.

Kept apart from the servicer so the servicer stays a translator: a refused call never
reaches it, and is answered PERMISSION_DENIED with the reason.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID

from tessera.policies.security import access, tenancy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Identity:
    """What a verified client certificate says: its role and what it is bound to."""

    role: str | None  # None: no Tessera role in the OU
    scope: tenancy.Scope | None = None  # None: bound to no deployment
    problem: str = ""  # why the certificate's scope URI is unusable


@functools.lru_cache(maxsize=64)
def identity_of_certificate(pem: bytes) -> Identity:
    """The role (the subject's first OU that is a role) and scope (URI SAN) of a certificate."""
    cert = x509.load_pem_x509_certificate(pem)
    role = None
    for attr in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME):
        value = attr.value if isinstance(attr.value, str) else attr.value.decode()
        if value in access.ROLES:
            role = value
            break
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    parsed = tenancy.parse(uris)
    return Identity(role, parsed.scope, parsed.problem)


def role_of_certificate(pem: bytes) -> str | None:
    """The role a client certificate claims: its subject's first OU, if one of the roles."""
    return identity_of_certificate(pem).role


def replica_named(method: str, message: Any) -> str | None:
    """The replica id a request message names (None: names none)."""
    if method == "ImportKV":
        return str(message.header.replica_id) if message.HasField("header") else None
    if method == "GenerateMux":
        return str(message.start.replica_id) if message.HasField("start") else None
    if "replica_id" in message.DESCRIPTOR.fields_by_name:
        return str(message.replica_id)
    return None


class Authorizer(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Wraps every handler with the role check, the deployment binding and the model root."""

    def __init__(self, *, tls: bool, model_root: str | None) -> None:
        self.tls = tls
        self.model_root = os.path.realpath(model_root) if model_root else None

    def identity(self, context: grpc.aio.ServicerContext[Any, Any]) -> tuple[Identity, str]:
        if not self.tls:
            return Identity(None), ""
        pems = context.auth_context().get("x509_pem_cert") or []
        if not pems:
            return Identity(None), "no client certificate"
        ident = identity_of_certificate(bytes(pems[0]))
        if ident.role is None:
            return ident, "the client certificate names no Tessera role in its OU"
        return ident, ident.problem

    async def deny(
        self, method: str, reason: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        log.warning("refused %s: %s (peer %s)", method, reason, context.peer())
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, reason)

    async def check(
        self, method: str, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """Role, then (for a first or only message) its replica and paths; aborts if refused."""
        ident, problem = self.identity(context)
        if problem:
            await self.deny(method, f"{method}: {problem}", context)
        decision = access.authorize(method, ident.role)
        if decision.allowed and request is not None:
            decision = self.binding(method, request, ident)
        if decision.allowed and method in access.PATH_METHODS and request is not None:
            path = str(request.model_path)
            decision = access.check_model_path(path, os.path.realpath(path), self.model_root)
        if decision.allowed and method in access.ADAPTER_PATH_METHODS and request is not None:
            for a in request.adapters:  # every adapter folder under the model root too
                path = str(a.path)
                decision = access.check_model_path(path, os.path.realpath(path), self.model_root)
                if not decision.allowed:
                    break
        if decision.allowed and method == "LoadBlock" and request is not None:
            decision = self._share(request)
        if decision.allowed and method == "LoadBlock" and request is not None:
            decision = self._stitch(request)
        if decision.allowed and method == "LoadBlock" and request is not None:
            decision = self._speculate(request)
        if not decision.allowed:
            await self.deny(method, decision.reason, context)

    def binding(self, method: str, message: Any, ident: Identity) -> access.Decision:
        """The deployment binding for one message (every message of a stream goes here)."""
        if not self.tls:
            return access.ALLOW
        rid = replica_named(method, message)
        if rid is None:
            return access.ALLOW
        return tenancy.check_replica(method, ident.role, ident.scope, rid)

    def _share(self, request: Any) -> access.Decision:
        """A variant load's foundation checkpoint lies under the model root too."""
        if not request.HasField("share") or not request.share.foundation_path:
            return access.ALLOW
        path = str(request.share.foundation_path)
        decision = access.check_model_path(path, os.path.realpath(path), self.model_root)
        if decision.allowed:
            return decision
        return access.Decision(
            False, decision.reason.replace("model_path", "share.foundation_path", 1)
        )

    def _stitch(self, request: Any) -> access.Decision:
        """A stitched front's zoo folder and next model lie under the model root too."""
        if not request.HasField("stitch"):
            return access.ALLOW
        for field in ("zoo", "next_model_path"):
            path = str(getattr(request.stitch, field))
            decision = access.check_model_path(path, os.path.realpath(path), self.model_root)
            if not decision.allowed:
                return access.Decision(
                    False, decision.reason.replace("model_path", f"stitch.{field}", 1)
                )
        return access.ALLOW

    def _speculate(self, request: Any) -> access.Decision:
        """A speculated bottleneck's zoo folder lies under the model root too."""
        if not request.HasField("speculate"):
            return access.ALLOW
        path = str(request.speculate.zoo)
        decision = access.check_model_path(path, os.path.realpath(path), self.model_root)
        if decision.allowed:
            return decision
        return access.Decision(False, decision.reason.replace("model_path", "speculate.zoo", 1))

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return None
        return _wrap(handler, access.method_name(details.method), self)


async def _stream(result: Any) -> AsyncGenerator[Any, None]:
    """Items of a streaming behaviour, whether it yields them or writes them to the context."""
    if hasattr(result, "__aiter__"):
        async for item in result:
            yield item
    else:
        await result


class _Checked:
    """A request stream whose first message is checked before the handler runs, and each
    later one as it is read: a refused message ends the stream (`refused` says why) and the
    wrapper answers PERMISSION_DENIED once the handler returns."""

    def __init__(self, first: Any, rest: AsyncIterator[Any], check: Callable[[Any], Any]) -> None:
        self.first, self.rest, self.check = first, rest, check
        self.refused = ""

    async def __aiter__(self) -> AsyncIterator[Any]:
        if self.first is None:
            return
        yield self.first
        async for msg in self.rest:
            decision = self.check(msg)
            if not decision.allowed:
                self.refused = decision.reason
                return
            yield msg


async def _checked_stream(method: str, requests: Any, context: Any, authz: Authorizer) -> _Checked:
    """The stream with its first message read and checked (aborts when it is refused)."""
    await authz.check(method, None, context)  # the role, before reading anything
    it = requests.__aiter__()
    first = await anext(it, None)
    ident, _ = authz.identity(context)
    if first is not None:
        decision = authz.binding(method, first, ident)
        if not decision.allowed:
            await authz.deny(method, decision.reason, context)
    return _Checked(first, it, lambda m: authz.binding(method, m, ident))


def _wrap(handler: grpc.RpcMethodHandler, method: str, authz: Authorizer) -> grpc.RpcMethodHandler:
    """The same handler, each behaviour preceded by the checks (requests seen when unary)."""
    check = authz.check
    kw = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            await check(method, request, context)
            return await inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **kw)
    if handler.unary_stream:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            await check(method, request, context)
            async for item in _stream(inner_us(request, context)):
                yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, **kw)
    if authz.tls and method in tenancy.REPLICA_METHODS:
        return _wrap_named_streams(handler, method, authz, kw)
    if handler.stream_unary:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: Any) -> Any:
            await check(method, None, context)
            return await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **kw)
    inner_ss = handler.stream_stream

    async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
        await check(method, None, context)
        async for item in _stream(inner_ss(requests, context)):
            yield item

    return grpc.stream_stream_rpc_method_handler(stream_stream, **kw)


def _wrap_named_streams(
    handler: grpc.RpcMethodHandler, method: str, authz: Authorizer, kw: dict[str, Any]
) -> grpc.RpcMethodHandler:
    """Streams whose messages name replicas (ImportKV, GenerateMux): each one checked. Other
    streams (a stage's activations) pass through untouched: no hop per message."""
    if handler.stream_unary:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: Any) -> Any:
            checked = await _checked_stream(method, requests, context, authz)
            reply = await inner_su(checked.__aiter__(), context)
            if checked.refused:
                await authz.deny(method, checked.refused, context)
            return reply

        return grpc.stream_unary_rpc_method_handler(stream_unary, **kw)
    inner_ss = handler.stream_stream

    async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
        checked = await _checked_stream(method, requests, context, authz)
        out = _stream(inner_ss(checked.__aiter__(), context))
        try:
            async for item in out:
                if checked.refused:
                    break
                yield item
        finally:
            await out.aclose()
        if checked.refused:
            await authz.deny(method, checked.refused, context)

    return grpc.stream_stream_rpc_method_handler(stream_stream, **kw)
