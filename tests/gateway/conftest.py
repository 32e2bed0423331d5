"""Fixtures shared by the gateway tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client session for one test."""
    async with aiohttp.ClientSession() as s:
        yield s
