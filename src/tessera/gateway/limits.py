"""Request limits of the gateway: sizes per request, concurrency per key, load shedding.

`Limits` is built once (CLI flags, `tessera up`, tests) and handed to `app.build`. The
body size is aiohttp's `client_max_size` (413); `check_request` bounds prompt tokens,
`max_tokens` and `n` (400, naming the field) once a prompt is tokenized;
`Admission.middleware` counts requests in flight per API key and in total and answers 429
with `Retry-After` at a key's limit or when saturated. The time limits where a peer can
stall (`body_timeout_s`, `body_bytes_in_flight`, `write_timeout_s`, the token timeouts
`dispatch` acts on, `request_timeout_s`) are tabled in docs/gateway.md. A limit of 0 is off.
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from tessera.gateway import auth, errors

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
GUARDED = ("/v1/completions", "/v1/chat/completions")


@dataclass(frozen=True)
class Limits:
    max_prompt_tokens: int = 0  # 0: only the model's context bounds the prompt
    max_tokens: int = 0  # largest `max_tokens`; an omitted one is capped here
    max_n: int = 0  # largest `n` (the parser's own bound still applies)
    max_concurrent_per_key: int = 0  # requests in flight per API key (or in all, keyless)
    max_in_flight_per_replica: int = 256  # beyond this times the ready replicas: 429
    retry_after_s: int = 1  # the Retry-After of a 429
    body_timeout_s: float = 30.0  # to receive a whole request body (408 after)
    body_bytes_in_flight: int = 256 << 20  # bodies being received at once (429 beyond)
    write_timeout_s: float = 30.0  # one write of a stream to a client (then it is dropped)
    first_token_timeout_s: float = 300.0  # queueing + prefill on one replica
    token_timeout_s: float = 60.0  # longest gap between two chunks of one replica's stream
    request_timeout_s: float = 3600.0  # one request from arrival to its last token (504)

    def __post_init__(self) -> None:
        for name in (
            "max_prompt_tokens",
            "max_tokens",
            "max_n",
            "max_concurrent_per_key",
            "max_in_flight_per_replica",
            "body_timeout_s",
            "body_bytes_in_flight",
            "write_timeout_s",
            "first_token_timeout_s",
            "token_timeout_s",
            "request_timeout_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0 (0 = no limit)")
        if self.retry_after_s < 1:
            raise ValueError("retry_after_s: must be >= 1")


def check_request(
    limits: Limits, prompt_tokens: int, max_tokens: int | None, default_max_tokens: int, n: int
) -> int:
    """The `max_tokens` to run with; ApiError(400) when the request exceeds a limit."""
    if limits.max_prompt_tokens and prompt_tokens > limits.max_prompt_tokens:
        raise errors.bad_request(
            f"prompt: {prompt_tokens} tokens exceed this gateway's limit of "
            f"{limits.max_prompt_tokens}",
            "prompt",
            "prompt_too_long",
        )
    if limits.max_n and n > limits.max_n:
        raise errors.bad_request(f"n: {n} exceeds this gateway's limit of {limits.max_n}", "n")
    if max_tokens is None:
        cap = limits.max_tokens or default_max_tokens
        return min(default_max_tokens, cap)
    if limits.max_tokens and max_tokens > limits.max_tokens:
        raise errors.bad_request(
            f"max_tokens: {max_tokens} exceeds this gateway's limit of {limits.max_tokens}",
            "max_tokens",
        )
    return max_tokens


def too_many(message: str, limits: Limits) -> errors.ApiError:
    return errors.ApiError(
        429,
        message,
        code="rate_limit_exceeded",
        headers={"Retry-After": str(limits.retry_after_s)},
    )


class Admission:
    """Counts requests in flight; admits or sheds them (the middleware)."""

    def __init__(self, limits: Limits, ready_replicas: Callable[[], int]) -> None:
        self.limits = limits
        self.ready_replicas = ready_replicas
        self.in_flight = 0
        self.per_key: collections.Counter[str] = collections.Counter()

    def admit(self, key: str) -> None:
        """Take a slot for `key` or raise 429."""
        lim = self.limits
        if lim.max_concurrent_per_key and self.per_key[key] >= lim.max_concurrent_per_key:
            raise too_many(
                f"too many concurrent requests for this API key (limit "
                f"{lim.max_concurrent_per_key}); retry after {lim.retry_after_s}s",
                lim,
            )
        cap = lim.max_in_flight_per_replica * max(1, self.ready_replicas())
        if lim.max_in_flight_per_replica and self.in_flight >= cap:
            raise too_many(
                f"the deployment is saturated ({self.in_flight} requests in flight); retry "
                f"after {lim.retry_after_s}s",
                lim,
            )
        self.in_flight += 1
        self.per_key[key] += 1

    def release(self, key: str) -> None:
        self.in_flight -= 1
        self.per_key[key] -= 1
        if self.per_key[key] <= 0:
            del self.per_key[key]

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "POST" or request.path not in GUARDED:
            return await handler(request)
        key = request.get(auth.KEY_NAME, auth.ANONYMOUS)
        self.admit(key)
        try:
            return await handler(request)
        finally:
            self.release(key)
