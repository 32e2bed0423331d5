"""Reading and parsing a request body safely: a time limit, a size limit, bounded JSON.

`middleware` runs before admission (`limits.Admission`) on the generation endpoints: it
reads the whole body within `Limits.body_timeout_s` (408 when a client sends it too
slowly, 413 over `GatewayConfig.max_body_bytes`) and parses it with `parse`, so a slow or
malformed body never holds an admission slot. `parse` answers 400 (never a 500) for what
the standard parser would choke on, spend long on, or pass through: more than
`MAX_CONTAINERS` arrays and objects (counted outside strings before parsing: a 2 MiB body
of empty lists would take seconds to parse), nesting deeper than `MAX_DEPTH`, integers
longer than `MAX_INT_DIGITS` digits (then parsed again with such integers read as
infinity, so the field's own check names it), a lone UTF-16 surrogate in any string
(naming the top-level field), and a body that is not a JSON object. Handlers read the
parsed body with `read` (cached on the request).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tessera.gateway import errors

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
KEY = web.RequestKey("tessera.body", dict[str, Any])  # the parsed body, on the request
MAX_DEPTH = 32  # nesting of arrays and objects
MAX_CONTAINERS = 4096  # arrays and objects in one body (a chat of ~2,000 messages)
MAX_INT_DIGITS = 32  # longer integers become infinity (int64 needs 19 digits)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included
# A \uD800-\uDFFF escape: the only way a surrogate enters (raw UTF-8 cannot hold one).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _bounded_int(text: str) -> int | float:
    digits = len(text) - (text[0] == "-")
    if digits > MAX_INT_DIGITS:
        return -math.inf if text[0] == "-" else math.inf
    return int(text)


def parse(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; ApiError(400) naming the problem (module docstring)."""
    if raw.count(b"[") + raw.count(b"{") > MAX_CONTAINERS:  # maybe inside strings
        bare = _STRING.sub(b'""', raw)
        if bare.count(b"[") + bare.count(b"{") > MAX_CONTAINERS:
            raise errors.bad_request(
                f"invalid JSON body: more than {MAX_CONTAINERS} arrays and objects",
                None,
                "invalid_json",
            )
    try:
        try:
            body = json.loads(raw)
        except ValueError as exc:
            if isinstance(exc, json.JSONDecodeError):
                raise
            # an integer over Python's digit limit: read such integers as infinity
            body = json.loads(raw, parse_int=_bounded_int)
    except RecursionError as exc:
        raise _too_deep() from exc
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise errors.bad_request(f"invalid JSON body: {exc}", None, "invalid_json") from exc
    if not isinstance(body, dict):
        raise errors.bad_request("the JSON body must be an object", None, "invalid_json")
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _depth(body) > MAX_DEPTH:
        raise _too_deep()
    if _SURROGATE_ESCAPE.search(raw):  # maybe a pair (fine) or an escaped backslash
        for key, value in body.items():
            if _has_surrogate(key) or _has_surrogate(value):
                raise errors.bad_request(
                    f"{key}: contains a lone UTF-16 surrogate (not valid Unicode text)",
                    key,
                    "invalid_unicode",
                )
    return body


def _too_deep() -> errors.ApiError:
    return errors.bad_request(
        f"invalid JSON body: nested deeper than {MAX_DEPTH} levels", None, "invalid_json"
    )


def _depth(value: object) -> int:
    """Nesting depth of arrays and objects (iterative: no recursion on hostile input)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > deepest:
            deepest = d
            if deepest > MAX_DEPTH:
                return deepest
        children = v.values() if isinstance(v, dict) else v
        stack.extend((c, d + 1) for c in children if isinstance(c, dict | list))
    return deepest


def _has_surrogate(value: object) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


async def read(request: web.Request, timeout_s: float, max_bytes: int = 0) -> dict[str, Any]:
    """Read (within `timeout_s`; 0 = no limit) and parse the body; cached on the request.
    `max_bytes` only words the 413 (the application enforces it)."""
    if KEY in request:
        return request[KEY]
    try:
        if timeout_s > 0:
            async with asyncio.timeout(timeout_s):
                raw = await request.read()
        else:
            raw = await request.read()
    except TimeoutError as exc:
        raise errors.ApiError(
            408, f"request body not received within {timeout_s:g}s", code="body_timeout"
        ) from exc
    except web.HTTPRequestEntityTooLarge as exc:
        raise errors.ApiError(
            413,
            f"request body too large (limit {max_bytes} bytes)"
            if max_bytes
            else "request body too large",
            code="body_too_large",
        ) from exc
    parsed = parse(raw)
    request[KEY] = parsed
    return parsed


class Budget:
    """Bytes of request bodies being received at once (their Content-Length, or the body
    limit when unannounced): a body that would pass `limit` is refused with 429 before it
    is read, so slow uploads cannot hold more memory than this."""

    def __init__(self, limit: int, retry_after_s: int) -> None:
        self.limit, self.retry_after_s, self.used = limit, retry_after_s, 0

    def take(self, n: int) -> None:
        if self.limit and self.used + n > self.limit:
            raise errors.ApiError(
                429,
                f"too many request bodies being received ({self.used} bytes); retry after "
                f"{self.retry_after_s}s",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        self.used += n

    def give(self, n: int) -> None:
        self.used -= n


def middleware(
    paths: tuple[str, ...],
    timeout_s: float,
    max_bytes: int,
    budget: Budget,
    refused: Callable[[str, int], None],
) -> Any:
    """Reads and parses the body of POSTs to `paths` before the next middleware runs,
    within `budget`; `refused(path, status)` counts a body refused here."""

    @web.middleware
    async def read_body(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "POST" and request.path in paths:
            size = request.content_length
            if size is None or size > max_bytes:
                size = max_bytes  # unannounced, or refused at max_bytes by the reader
            try:
                budget.take(size)
                try:
                    await read(request, timeout_s, max_bytes)
                finally:
                    budget.give(size)
            except errors.ApiError as exc:
                refused(request.path, exc.status)
                raise
        return await handler(request)

    return read_body
