"""Engine errors as gRPC statuses: the one mapping, used by every agent RPC handler.

`unary` and `streaming` wrap a servicer method so that an `EngineError` it raises ends
the RPC with its status (`code`) and message; `abort` does it by hand. Used by the
servicer, its `Scaling*` mixin and the stage-stream server; the message always names
the cause.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, NoReturn, TypeAlias, TypeVar

import grpc

from tessera_agent.engine import errors

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
S = TypeVar("S")
Req = TypeVar("Req")
Rep = TypeVar("Rep")

_CODES: dict[type[errors.EngineError], grpc.StatusCode] = {
    errors.NotFoundError: grpc.StatusCode.NOT_FOUND,
    errors.InvalidArgumentError: grpc.StatusCode.INVALID_ARGUMENT,
    errors.ResourceExhaustedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.FailedPreconditionError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.UnavailableError: grpc.StatusCode.UNAVAILABLE,
}


def code(exc: BaseException) -> grpc.StatusCode:
    for cls, status in _CODES.items():
        if isinstance(exc, cls):
            return status
    if isinstance(exc, FileNotFoundError):
        return grpc.StatusCode.NOT_FOUND
    return grpc.StatusCode.INTERNAL


async def abort(ctx: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> NoReturn:
    """End the RPC with the status of `exc` and its message."""
    await ctx.abort(code(exc), str(exc))
    raise AssertionError("unreachable")  # ctx.abort raises


def unary(
    fn: Callable[[S, Req, Ctx], Awaitable[Rep]],
) -> Callable[[S, Req, Ctx], Coroutine[Any, Any, Rep]]:
    """A handler returning one reply: an `EngineError` it raises aborts the RPC."""

    @functools.wraps(fn)
    async def handler(self: S, request: Req, context: Ctx) -> Rep:
        try:
            return await fn(self, request, context)
        except errors.EngineError as exc:
            await abort(context, exc)

    return handler


def streaming(
    fn: Callable[[S, Req, Ctx], AsyncIterator[Rep]],
) -> Callable[[S, Req, Ctx], AsyncIterator[Rep]]:
    """A handler yielding replies: an `EngineError` it raises aborts the RPC."""

    @functools.wraps(fn)
    async def handler(self: S, request: Req, context: Ctx) -> AsyncIterator[Rep]:
        try:
            async for reply in fn(self, request, context):
                yield reply
        except errors.EngineError as exc:
            await abort(context, exc)

    return handler
