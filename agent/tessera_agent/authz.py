"""The agent's authorization interceptor: caller role per RPC, and the model root for loads.

Built by `tessera_agent.server` when it makes the gRPC server; decisions come from the pure
`tessera.policies.access`. The caller's role is the Organizational Unit (OU) of the client
certificate that mutual TLS already verified against the deployment's CA (the transport
refuses any other client before a call reaches here). On a plaintext server (loopback
`tessera up`) there is no identity: every method is open, but the model root still holds.

Kept apart from the servicer so the servicer stays a translator: a refused call never
reaches it, and is answered PERMISSION_DENIED with the reason.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID

from tessera.policies import access

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=64)
def role_of_certificate(pem: bytes) -> str | None:
    """The role a client certificate claims: its subject's first OU, if one of the roles."""
    cert = x509.load_pem_x509_certificate(pem)
    for attr in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME):
        value = attr.value if isinstance(attr.value, str) else attr.value.decode()
        if value in access.ROLES:
            return value
    return None


class Authorizer(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Wraps every handler with the role check and, for loads, the model-root check."""

    def __init__(self, *, tls: bool, model_root: str | None) -> None:
        self.tls = tls
        self.model_root = os.path.realpath(model_root) if model_root else None

    def _role(self, context: grpc.aio.ServicerContext[Any, Any]) -> tuple[str | None, str]:
        if not self.tls:
            return None, ""
        pems = context.auth_context().get("x509_pem_cert") or []
        if not pems:
            return None, "no client certificate"
        role = role_of_certificate(bytes(pems[0]))
        if role is None:
            return None, "the client certificate names no Tessera role in its OU"
        return role, ""

    async def _check(
        self, method: str, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        role, problem = self._role(context)
        if problem:
            log.warning("refused %s: %s (peer %s)", method, problem, context.peer())
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{method}: {problem}")
        decision = access.authorize(method, role)
        if decision.allowed and method in access.PATH_METHODS and request is not None:
            path = str(request.model_path)
            decision = access.check_model_path(path, os.path.realpath(path), self.model_root)
        if decision.allowed and method in access.ADAPTER_PATH_METHODS and request is not None:
            for a in request.adapters:  # every adapter folder under the model root too
                path = str(a.path)
                decision = access.check_model_path(path, os.path.realpath(path), self.model_root)
                if not decision.allowed:
                    break
        if not decision.allowed:
            log.warning("refused %s: %s (peer %s)", method, decision.reason, context.peer())
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, decision.reason)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return None
        return _wrap(handler, access.method_name(details.method), self._check)


async def _stream(result: Any) -> AsyncIterator[Any]:
    """Items of a streaming behaviour, whether it yields them or writes them to the context."""
    if hasattr(result, "__aiter__"):
        async for item in result:
            yield item
    else:
        await result


Check = Callable[[str, Any, "grpc.aio.ServicerContext[Any, Any]"], Awaitable[None]]


def _wrap(handler: grpc.RpcMethodHandler, method: str, check: Check) -> grpc.RpcMethodHandler:
    """The same handler, each behaviour preceded by `check` (requests seen when unary)."""
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
