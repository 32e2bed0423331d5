"""Optional API keys for the gateway, OpenAI style (`Authorization: Bearer KEY`).

The keys file is mounted from a Secret: one key per line, either `KEY` or `NAME KEY`
(`#` starts a comment). The name labels the key's concurrency limit and logs; a key
without one is named by the start of its SHA-256. Only digests are kept in memory, and a
presented key is looked up by its digest, so no comparison runs over the secret itself.
The file is re-read when its modification time changes: rotating keys needs no restart.

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

from aiohttp import typedefs, web

from tessera.gateway import errors

log = logging.getLogger(__name__)

KEY_NAME = web.RequestKey("tessera_api_key", str)  # the authenticated key's name
ANONYMOUS = ""  # the key name when keys are off
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


class ApiKeys:
    """The accepted keys, re-read from `path` when the file changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp = -1.0
        self._keys: dict[str, str] = {}
        self._reload()
        if not self._keys:
            raise ValueError(f"api keys file {path}: no keys")

    def _reload(self) -> None:
        try:
            stamp = os.stat(self.path).st_mtime
            if stamp == self._stamp:
                return
            with open(self.path, encoding="utf-8") as f:
                keys = parse_keys(f.read())
        except (OSError, ValueError) as exc:
            if not self._keys:
                raise ValueError(f"api keys file {self.path}: {exc}") from exc
            log.error("api keys file unreadable, keeping the previous keys: %s", exc)
            return
        self._stamp, self._keys = stamp, keys

    def name_of(self, presented: str) -> str | None:
        """The name of a presented key, or None if it is not accepted."""
        self._reload()
        return self._keys.get(_digest(presented))


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
