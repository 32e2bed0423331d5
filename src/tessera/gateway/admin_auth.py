"""The gateway's admin API belongs to the operator: `/admin/` needs its token when keys are on.

Once the gateway authenticates anything (API keys, `GatewayConfig.api_keys_file`) or has
an admin token (`GatewayConfig.admin_token_file`, the Secret the operator also reads),
every `/admin/` request must carry `Authorization: Bearer <admin token>` (a user's API key
is not one). Answers, OpenAI-shaped: 401 `missing_admin_token`, 403 `invalid_admin_token`,
403 `admin_token_not_configured` (keys on, no admin token: the admin API stays closed).
`/health`, `/metrics`, `/v1/` (`auth.py`) and `/admin/v1/status` (`status_page.py`, a
user's key) are not guarded here. The token file is re-read when it changes
(`auth.SecretFile`); only its digest is kept, compared in constant time. Built by
`server.start_gateway`; `guards` is what `app.build` installs.
"""

from __future__ import annotations

import hashlib
import hmac

from aiohttp import typedefs, web

from tessera.gateway import auth, errors

PREFIX = "/admin/"
OWN_GUARD = frozenset({"/admin/v1/status"})  # guarded by status_page (a user's API key)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _token_digest(text: str) -> bytes:
    token = next((x.strip() for x in text.splitlines() if x.strip()), "")
    if not token:
        raise ValueError("empty")
    return _digest(token)


class AdminToken:
    """The admin token in `path` (its first non-empty line), re-read when the file changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = auth.SecretFile(path, "admin token file", _token_digest)

    def accepts(self, presented: str) -> bool:
        return hmac.compare_digest(_digest(presented), self._file.value())


def middleware(token: AdminToken | None) -> typedefs.Middleware:
    """401/403 on `/admin/` without the admin token (module docstring)."""

    @web.middleware
    async def check(request: web.Request, handler: auth.Handler) -> web.StreamResponse:
        if request.path.startswith(PREFIX) and request.path not in OWN_GUARD:
            if token is None:
                raise errors.ApiError(
                    403,
                    "The admin API is closed: API keys are on and the gateway has no admin "
                    "token (--admin-token-file, the operator's --gateway-admin-token-file).",
                    code="admin_token_not_configured",
                )
            presented = auth.bearer(request)
            if not presented:
                raise errors.ApiError(
                    401,
                    "The admin API needs the operator's admin token: send it as "
                    "'Authorization: Bearer TOKEN'.",
                    code="missing_admin_token",
                )
            if not token.accepts(presented):
                raise errors.ApiError(
                    403, "Incorrect admin token provided.", code="invalid_admin_token"
                )
        return await handler(request)

    return check


def guards(keys: auth.ApiKeys | None, token: AdminToken | None) -> list[typedefs.Middleware]:
    """The authentication middlewares `app.build` installs: API keys on `/v1/` when set,
    the admin token on `/admin/` when either is set; none when neither is."""
    out = [auth.middleware(keys)] if keys is not None else []
    if keys is not None or token is not None:
        out.append(middleware(token))
    return out
