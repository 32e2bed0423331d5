"""The one place where gRPC channels and servers are made (limits, keepalive, mutual TLS).

Called by the agent (server, peer stages, block copies, KV moves), the gateway, the operator's
actuator and the command-line tools, so every hop agrees on message-size limits (a prefill
chunk's hidden states are megabytes) and on security: with TLS, every server demands a client
certificate signed by the deployment's CA and every channel presents one. Each takes the
process's `TlsFiles` (None: plaintext, `tessera up`'s loopback mode), built once by the entry
point from `TESSERA_TLS_DIR` (`tls_from_dir`: `ca.crt`, `tls.crt`, `tls.key`, a Kubernetes TLS
Secret's layout, mounted by the chart); nothing here reads the environment. Files are re-read
per handshake and channel, so a rotated Secret needs no restart. Clients check the server
certificate against one DNS name every agent certificate carries (`AGENT_SERVER_NAME`), not the
changing pod address.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

MAX_MESSAGE_BYTES = 512 * 1024 * 1024
TLS_DIR_ENV = "TESSERA_TLS_DIR"
AGENT_SERVER_NAME = "tessera-agent"

OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # A restarted peer (same address) must be reachable again within seconds: gRPC's default
    # reconnect back-off grows to 120 s, which left a pipeline's link to a restarted next
    # stage failing long after the stage was back (found by `tessera bench chaos`).
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]

# Servers accept the clients' keepalive pings (every `grpc.keepalive_time_ms`) even while a
# long call sends no data: gRPC's default floor for such pings is 5 minutes, and a peer
# pinging more often gets GOAWAY `too_many_pings` after two strikes, which failed a
# LoadBlock that compiled for minutes with UNAVAILABLE "Too many pings".
SERVER_OPTIONS: list[tuple[str, Any]] = [
    *OPTIONS,
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
]


@dataclass(frozen=True)
class TlsFiles:
    """Where this process's certificate, its key and the deployment's CA lie."""

    ca: Path
    cert: Path
    key: Path
    server_name: str = AGENT_SERVER_NAME  # the DNS SAN clients expect of agents

    @classmethod
    def from_dir(cls, folder: str | Path) -> TlsFiles:
        d = Path(folder)
        files = cls(d / "ca.crt", d / "tls.crt", d / "tls.key")
        missing = [str(p) for p in (files.ca, files.cert, files.key) if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"{TLS_DIR_ENV}={d}: missing {', '.join(missing)}")
        return files

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(CA bundle, certificate chain, private key), read now."""
        return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()


def tls_from_dir(folder: str) -> TlsFiles | None:
    """The TLS files in `folder` (an entry point's `$TESSERA_TLS_DIR`); None when it is ""."""
    return TlsFiles.from_dir(folder) if folder else None


# Said by every client that would talk to agents off this host without TLS (the operator,
# a gateway, `tessera up --agent`): what an unauthenticated agent port gives away.
PLAINTEXT_WARNING = (
    f"gRPC to the agents is plaintext ({TLS_DIR_ENV} is unset): anyone who reaches an "
    "agent's port can load and unload blocks, read every deployment's weights and KV cache, "
    "and generate. Use it on loopback or an isolated test network only (docs/security.md)."
)


def warn_if_plaintext(log: logging.Logger, tls: TlsFiles | None) -> bool:
    """Log `PLAINTEXT_WARNING` when this process has no TLS files; True if it did."""
    if tls is not None:
        return False
    log.warning(PLAINTEXT_WARNING)
    return True


def describe_mode(files: TlsFiles | None) -> str:
    """One line saying how this process's gRPC is protected (printed by `tessera up`)."""
    if files is None:
        return (
            f"gRPC is plaintext (loopback only; set {TLS_DIR_ENV} for mutual TLS, "
            "see docs/security.md)"
        )
    return f"gRPC uses mutual TLS with the certificate in {files.cert.parent}"


def _channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    ca, cert, key = files.read()
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


def _channel_options(files: TlsFiles | None) -> list[tuple[str, Any]]:
    if files is None:
        return OPTIONS
    return [*OPTIONS, ("grpc.ssl_target_name_override", files.server_name)]


def channel(address: str, tls: TlsFiles | None) -> grpc.aio.Channel:
    """An asyncio channel to `host:port` with Tessera's limits; mutual TLS with `tls`'s
    certificate, plaintext when it is None."""
    files = tls
    if files is None:
        return grpc.aio.insecure_channel(address, options=OPTIONS)
    return grpc.aio.secure_channel(
        address, _channel_credentials(files), options=_channel_options(files)
    )


def sync_channel(address: str, tls: TlsFiles | None) -> grpc.Channel:
    """A blocking channel, for command-line tools that make a few calls."""
    files = tls
    if files is None:
        return grpc.insecure_channel(address, options=OPTIONS)
    return grpc.secure_channel(
        address, _channel_credentials(files), options=_channel_options(files)
    )


class _ReloadingCertificates:
    """Re-reads the files when they change; grpc asks before every handshake."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self.stamp = self._stamp()

    def _stamp(self) -> tuple[float, ...]:
        return tuple(p.stat().st_mtime for p in (self.files.ca, self.files.cert, self.files.key))

    def config(self) -> grpc.ServerCertificateConfiguration:
        ca, cert, key = self.files.read()
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        try:
            stamp = self._stamp()
            if stamp == self.stamp:
                return None  # unchanged: keep the current configuration
            cfg = self.config()
        except OSError:
            return None  # mid-rotation (a Secret update swaps a symlink): keep the old one
        self.stamp = stamp
        return cfg


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Server credentials that demand a client certificate signed by the CA in `files`."""
    reload = _ReloadingCertificates(files)
    return grpc.dynamic_ssl_server_credentials(
        reload.config(), reload, require_client_authentication=True
    )


def server(interceptors: tuple[grpc.aio.ServerInterceptor, ...] = ()) -> grpc.aio.Server:
    """An asyncio server with Tessera's limits; the caller adds servicers and a port."""
    return grpc.aio.server(options=SERVER_OPTIONS, interceptors=interceptors)


def add_port(srv: grpc.aio.Server, address: str, tls: TlsFiles | None) -> int:
    """Bind `address` (mutual TLS with `tls`, plaintext when None); returns the port."""
    files = tls
    if files is None:
        return int(srv.add_insecure_port(address))
    return int(srv.add_secure_port(address, server_credentials(files)))
