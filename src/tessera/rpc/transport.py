"""The one place where gRPC channels and servers are made (limits, keepalive, later TLS).

Called by the agent (its server and its connections to peer stages), the gateway and the
operator's actuator. Keeping options here means every hop agrees on message-size limits:
hidden states of a large prefill chunk are megabytes.
"""

from __future__ import annotations

from typing import Any

import grpc

MAX_MESSAGE_BYTES = 512 * 1024 * 1024

OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


def channel(address: str) -> grpc.aio.Channel:
    """An insecure asyncio channel to `host:port` with Tessera's limits."""
    return grpc.aio.insecure_channel(address, options=OPTIONS)


def sync_channel(address: str) -> grpc.Channel:
    """A blocking channel, for command-line tools that make a few calls."""
    return grpc.insecure_channel(address, options=OPTIONS)


def server() -> grpc.aio.Server:
    """An asyncio server with Tessera's limits; the caller adds servicers and ports."""
    return grpc.aio.server(options=OPTIONS)
