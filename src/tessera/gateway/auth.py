"""Optional API keys for the gateway, OpenAI style (`Authorization: Bearer KEY`).

The keys file is mounted from a Secret: one key per line, either `KEY` or `NAME KEY`
(`#` starts a comment). The name labels the key's concurrency limit and logs; a key
without one is named by the start of its SHA-256. Only digests are kept in memory, and a
presented key is looked up by its digest, so no comparison runs over the secret itself.
The file is re-read when its modification time changes (`SecretFile`, which the admin
token's file uses too): rotating keys needs no restart.

Built by `server.start_gateway` when `GatewayConfig.api_keys_file` is set; `app.build`
installs `middleware`, which guards the `/v1/` endpoints (not /health or /metrics) and
answers 401 with an OpenAI-shaped body; the key's name is left in `request[KEY_NAME]` for
the per-key limits (`limits.py`).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from aiohttp import typedefs, web

from tessera.gateway import errors

log = logging.getLogger(__name__)

KEY_NAME = web.RequestKey("tessera_api_key", str)  # the authenticated key's name
ANONYMOUS = ""  # the key name when keys are off
T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_keys(text: str) -> dict[str, str]:
    """Keys file text -> {sha256 of key: name}; ValueError on a malformed line."""
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) > 2:
            raise ValueError(f"keys file line {n}: expected KEY or NAME KEY")
        key = parts[-1]
        name = parts[0] if len(parts) == 2 else f"key-{_digest(key)[:8]}"
        out[_digest(key)] = name
    return out


class SecretFile(Generic[T]):
    """`parse` of the text in `path`, read again when the file's modification time changes.
    The first read raises ValueError naming `what` and the path; a later failed read
    (unreadable, or `parse` raised ValueError) is logged and keeps the value read before."""

    def __init__(self, path: str, what: str, parse: Callable[[str], T]) -> None:
        self.path, self.what, self.parse = path, what, parse
        self._stamp = -1.0
        self._value: T | None = None
        self.value()

    def value(self) -> T:
        """The current value, after re-reading the file if it changed."""
        try:
            stamp = os.stat(self.path).st_mtime
            if stamp != self._stamp or self._value is None:
                with open(self.path, encoding="utf-8") as f:
                    self._value, self._stamp = self.parse(f.read()), stamp
        except (OSError, ValueError) as exc:
            if self._value is None:
                raise ValueError(f"{self.what} {self.path}: {exc}") from exc
            log.error("%s %s unreadable, keeping the previous one: %s", self.what, self.path, exc)
        return self._value


class ApiKeys:
    """The accepted keys, re-read from `path` when the file changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = SecretFile(path, "api keys file", parse_keys)
        if not self._file.value():
            raise ValueError(f"api keys file {path}: no keys")

    def name_of(self, presented: str) -> str | None:
        """The name of a presented key, or None if it is not accepted."""
        return self._file.value().get(_digest(presented))


def unauthorized(message: str) -> errors.ApiError:
    return errors.ApiError(401, message, code="invalid_api_key")


def bearer(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def middleware(keys: ApiKeys) -> typedefs.Middleware:
    """aiohttp middleware: 401 on /v1/ without an accepted key."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/v1/"):
            token = bearer(request)
            if not token:
                raise unauthorized(
                    "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'."
                )
            name = keys.name_of(token)
            if name is None:
                raise unauthorized("Incorrect API key provided.")
            request[KEY_NAME] = name
        return await handler(request)

    return check
