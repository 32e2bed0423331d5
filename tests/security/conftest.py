"""Fixtures of the security tests."""

from __future__ import annotations

from tests.gateway.conftest import session

__all__ = ["session"]
