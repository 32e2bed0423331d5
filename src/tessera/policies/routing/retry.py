"""Where a generation goes after an attempt on a replica fails: reject, retry, or give up.

Pure. Inputs: the gRPC status code name and details of one failed attempt (the agent's,
or the gateway's own: DEADLINE_EXCEEDED for a replica that sent no token in time, ABORTED
for a stream that ended without finishing) and the request's variant; once no ready
replica is left untried, every failure of the request. Outputs: `Verdict` (reject the
request with 400, or retry it on another ready replica, marking this one failed or not)
and `GiveUp` (the HTTP status, message, field and error code the request ends with).
A retry after tokens were yielded continues the request where it stopped and, with no
replica left, ends it with `ReplicaLost` rather than `give_up`; both are the caller's.
Caller: `tessera.gateway.dispatch.Dispatcher` (every attempt of every completion request).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

INVALID_ARGUMENT = "INVALID_ARGUMENT"
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
NOT_FOUND = "NOT_FOUND"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
ABORTED = "ABORTED"


@dataclass(frozen=True)
class Verdict:
    """What one failed attempt means for the request and for the replica."""

    retry: bool  # False: the request itself is bad (400 with the details, no retry)
    mark_failed: bool  # the replica is marked failed (out of routing until it recovers)


@dataclass(frozen=True)
class Failure:
    """One failed attempt of a request."""

    replica: str
    code: str  # gRPC status code name
    message: str


@dataclass(frozen=True)
class GiveUp:
    """The error a request ends with when no replica is left to try."""

    status: int  # HTTP status
    message: str
    code: str  # OpenAI-style error code
    param: str | None = None  # the request field to blame


def _is_variant_missing(code: str, details: str, variant: str) -> bool:
    # the agent's NOT_FOUND for an adapter it does not serve (any more) starts "variant"
    return code == NOT_FOUND and bool(variant) and details.startswith("variant")


def on_error(code: str, details: str, variant: str = "") -> Verdict:
    """INVALID_ARGUMENT: reject (the request is bad). RESOURCE_EXHAUSTED (larger than that
    replica's whole KV pool) and NOT_FOUND for the request's variant: the replica is fine,
    try another. Anything else (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, ...): the
    replica is marked failed and the request moves to another."""
    if code == INVALID_ARGUMENT:
        return Verdict(retry=False, mark_failed=False)
    if code == RESOURCE_EXHAUSTED or _is_variant_missing(code, details, variant):
        return Verdict(retry=True, mark_failed=False)
    return Verdict(retry=True, mark_failed=True)


def give_up(failures: Sequence[Failure]) -> GiveUp:
    """No ready replica left and no token yielded: 503 when none was ready (or the failures
    are mixed), 400 `request_too_large` when no replica's KV pool can hold the request, 404
    `model_not_found` when no replica serves its variant."""
    if not failures:
        return GiveUp(503, "no replica is ready to serve this model", "no_replica_ready")
    if all(f.code == RESOURCE_EXHAUSTED for f in failures):
        return GiveUp(
            400,
            f"the request does not fit any replica's KV cache ({failures[0].message})",
            "request_too_large",
            "max_tokens",
        )
    if all(f.code == NOT_FOUND and f.message.startswith("variant") for f in failures):
        return GiveUp(404, failures[0].message, "model_not_found", "model")
    summary = "; ".join(f"{f.replica}: {f.code} {f.message}" for f in failures)
    return GiveUp(503, f"every replica tried failed ({summary})", "replicas_unavailable")
