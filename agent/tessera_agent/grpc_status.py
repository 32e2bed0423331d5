"""Engine errors as gRPC statuses: the one mapping, used by every agent RPC handler.

Called by the servicer and the stage-stream server; the message always names the cause.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from tessera_agent.engine import errors

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
