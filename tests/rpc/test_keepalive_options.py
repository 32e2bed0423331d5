"""Servers tolerate the keepalive pings Tessera's own clients send during a long call."""

from __future__ import annotations

from tessera.rpc import transport


def test_server_accepts_client_pings_during_a_silent_call() -> None:
    client = dict(transport.OPTIONS)
    server = dict(transport.SERVER_OPTIONS)
    # a ping every keepalive_time_ms must not be "too many" for the server
    assert (
        server["grpc.http2.min_recv_ping_interval_without_data_ms"]
        < client["grpc.keepalive_time_ms"]
    )
    assert server["grpc.http2.max_ping_strikes"] == 0
    # and the server keeps every client limit (message sizes, back-off)
    assert {k: v for k, v in server.items() if k in client} == client
