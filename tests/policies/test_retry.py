"""The gateway's retry decisions (`tessera.policies.routing.retry`): a table per function."""

from __future__ import annotations

import pytest

from tessera.policies.routing import retry

F = retry.Failure


@pytest.mark.parametrize(
    ("code", "details", "variant", "want"),
    [
        # the request itself is bad: 400, no retry, the replica is fine
        ("INVALID_ARGUMENT", "prompt too long", "", retry.Verdict(False, False)),
        ("INVALID_ARGUMENT", "variant x", "x", retry.Verdict(False, False)),
        # larger than that replica's whole KV pool: another replica may hold it
        ("RESOURCE_EXHAUSTED", "needs 90 pages of 64", "", retry.Verdict(True, False)),
        # the replica does not serve the request's variant (any more): try the others
        ("NOT_FOUND", "variant 'a' is not loaded", "a", retry.Verdict(True, False)),
        # NOT_FOUND for anything else, or without a variant asked: the replica is broken
        ("NOT_FOUND", "replica r0 is not loaded", "a", retry.Verdict(True, True)),
        ("NOT_FOUND", "variant 'a' is not loaded", "", retry.Verdict(True, True)),
        ("UNAVAILABLE", "connection refused", "", retry.Verdict(True, True)),
        ("FAILED_PRECONDITION", "draining", "", retry.Verdict(True, True)),
        ("INTERNAL", "boom", "a", retry.Verdict(True, True)),
        # the gateway's own: no token in time, a stream ended without finishing
        ("DEADLINE_EXCEEDED", "the replica sent no token for 5s", "", retry.Verdict(True, True)),
        ("ABORTED", "the replica ended the request: error", "", retry.Verdict(True, True)),
    ],
)
def test_on_error(code: str, details: str, variant: str, want: retry.Verdict) -> None:
    assert retry.on_error(code, details, variant) == want


@pytest.mark.parametrize(
    ("failures", "status", "code", "param"),
    [
        ((), 503, "no_replica_ready", None),
        ((F("r0", "RESOURCE_EXHAUSTED", "big"),), 400, "request_too_large", "max_tokens"),
        (
            (F("r0", "RESOURCE_EXHAUSTED", "big"), F("r1", "RESOURCE_EXHAUSTED", "bigger")),
            400,
            "request_too_large",
            "max_tokens",
        ),
        (
            (F("r0", "NOT_FOUND", "variant 'a' is not loaded"),),
            404,
            "model_not_found",
            "model",
        ),
        ((F("r0", "UNAVAILABLE", "down"),), 503, "replicas_unavailable", None),
        # mixed failures: no one cause to blame
        (
            (F("r0", "RESOURCE_EXHAUSTED", "big"), F("r1", "UNAVAILABLE", "down")),
            503,
            "replicas_unavailable",
            None,
        ),
        (
            (F("r0", "NOT_FOUND", "variant 'a' is not loaded"), F("r1", "RESOURCE_EXHAUSTED", "")),
            503,
            "replicas_unavailable",
            None,
        ),
        ((F("r0", "NOT_FOUND", "replica r0 is not loaded"),), 503, "replicas_unavailable", None),
    ],
)
def test_give_up(
    failures: tuple[retry.Failure, ...], status: int, code: str, param: str | None
) -> None:
    end = retry.give_up(failures)
    assert (end.status, end.code, end.param) == (status, code, param)


def test_give_up_messages_name_the_cause() -> None:
    assert retry.give_up([F("r0", "RESOURCE_EXHAUSTED", "needs 90 pages")]).message == (
        "the request does not fit any replica's KV cache (needs 90 pages)"
    )
    assert retry.give_up([F("r0", "NOT_FOUND", "variant 'a' gone")]).message == "variant 'a' gone"
    both = retry.give_up([F("r0", "UNAVAILABLE", "down"), F("r1", "ABORTED", "ended")])
    assert both.message == "every replica tried failed (r0: UNAVAILABLE down; r1: ABORTED ended)"
