"""Client-facing errors in OpenAI's format: `{"error": {message, type, param, code}}`.

Raised anywhere below the HTTP handlers (request parsing, tokenization, dispatch) and
turned into a JSON response by the error middleware in `app.py` (or an SSE error event
once a stream has started). A message is cut at `MAX_MESSAGE_CHARS`, so an error never
echoes a huge value back.
"""

from __future__ import annotations

from typing import Any

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_exceeded",
}


MAX_MESSAGE_CHARS = 1024


class ApiError(Exception):
    """An HTTP error with OpenAI's body; `param` names the offending request field."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if len(message) > MAX_MESSAGE_CHARS:  # never echo a huge value back
            message = message[:MAX_MESSAGE_CHARS] + "..."
        super().__init__(message)
        self.headers = headers or {}  # e.g. Retry-After of a 429
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "server_error")

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """400 for a malformed or out-of-range request."""
    return ApiError(400, message, param=param, code=code or "invalid_value")


def unavailable(message: str, code: str = "no_replica_ready") -> ApiError:
    """503: no replica can take the request now."""
    return ApiError(503, message, code=code)
