"""Engine error types; the agent servicer maps each to one gRPC status code.

Raised by the loader, KV cache, scheduler and stages; caught only at the servicer
boundary (`tessera_agent.servicer`), which turns them into statuses whose message names
the cause.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class: every engine failure a client can act on."""


class NotFoundError(EngineError):
    """A model path, tensor, block or sequence does not exist (gRPC NOT_FOUND)."""


class InvalidArgumentError(EngineError):
    """A request is malformed: bad layer range, bad sampling parameters (INVALID_ARGUMENT)."""


class ResourceExhaustedError(EngineError):
    """A block or request does not fit the device budget or KV pool (RESOURCE_EXHAUSTED)."""


class FailedPreconditionError(EngineError):
    """The system is not in a state that allows the call: stage mismatch (FAILED_PRECONDITION)."""


class UnavailableError(EngineError):
    """A peer stage cannot be reached (UNAVAILABLE)."""
