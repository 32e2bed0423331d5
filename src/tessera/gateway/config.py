"""Gateway configuration: the served model, the listen address and the replicas to route to.

Built once by the caller (`tessera up`, the `tessera gateway` CLI, tests) and passed to
`server.start_gateway`. A replica is reached through its leader agent (stage 0), which
serves `Generate` for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tessera import env_flags
from tessera.gateway import hold as hold_mod
from tessera.gateway import limits as limits_mod
from tessera.rpc import transport


@dataclass(frozen=True)
class ReplicaEndpoint:
    """One replica and the `host:port` of its leader agent."""

    replica_id: str
    address: str

    def __post_init__(self) -> None:
        if not self.replica_id:
            raise ValueError("replica_id: must not be empty")
        host, sep, port = self.address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"address: {self.address!r} is not host:port")


def parse_replica(text: str) -> ReplicaEndpoint:
    """`ID=HOST:PORT` (the `--replica` CLI form) → ReplicaEndpoint; ValueError if malformed."""
    replica_id, sep, address = text.partition("=")
    if not sep:
        raise ValueError(f"replica: {text!r} is not ID=HOST:PORT")
    return ReplicaEndpoint(replica_id.strip(), address.strip())


MUX_ENV = "TESSERA_GENERATE_MUX"


def generate_mux_from(environ: Mapping[str, str]) -> bool:
    """The gateway's token path unless told (the entry points pass `os.environ`): ONE
    multiplexed `GenerateMux` stream per replica; one `Generate` call per request with
    `TESSERA_GENERATE_MUX=0` (which `tessera up` follows) or `tessera gateway
    --no-generate-mux`. On by default since the ninth stop: at 64 req/s the stream halves
    the CPU of the agent's loop and of the gateway per token, and the 8 req/s TTFT tail
    measured the same either way (docs/benchmarks-log.md, "Issue 16: the multiplexed
    stream by default"). A leader without `GenerateMux` gets per-request calls (`mux.py`)."""
    return env_flags.parse(MUX_ENV, environ.get(MUX_ENV, ""), True)


@dataclass(frozen=True)
class GatewayConfig:
    """Everything the gateway needs; validated here so a bad value fails at startup.

    `model_name`/`model_path` may be left empty when `routes_file` names them; replicas in
    a routes file replace `replicas`.
    """

    model_name: str
    model_path: str
    host: str = "127.0.0.1"
    port: int = 8000  # 0 picks a free port; GatewayHandle.url tells which
    replicas: tuple[ReplicaEndpoint, ...] = ()
    routes_file: str = ""  # JSON routes, re-read when its mtime changes (see routes.py)
    poll_interval_s: float = 1.0  # Describe poll period of every leader
    # How often the routes file is checked for a change (a stat; a changed file is applied
    # at once and its new replicas polled). A drop's donors leave the routes before they
    # drain, so this bounds how long a drop waits for the gateway (docs/overload.md).
    routes_check_s: float = 0.02
    poll_timeout_s: float = 2.0  # a Describe slower than this marks the replica not ready
    failure_backoff_s: float = 3.0  # a replica failing a request sits out this long
    max_body_bytes: int = 2 << 20  # largest accepted HTTP request body (413 above)
    routing_seed: int = 0  # seeds the weighted per-class choice
    api_keys_file: str = ""  # accepted API keys (auth.py); "" = no authentication
    admin_token_file: str = ""  # the operator's token for /admin/ (admin_auth.py)
    limits: limits_mod.Limits = field(default_factory=limits_mod.Limits)
    arrival_span_s: float = 10.0  # span of the per-class arrival counts (arrivals.py)
    live_classes_file: str = ""  # live classifier JSON (workload.live_classes.to_json)
    kv_dispatch: bool = True  # KV-owner-first dispatch (kv_affinity.py); False: the router's
    # One multiplexed GenerateMux stream per replica (mux.py, the default); False: a
    # Generate call per request (`generate_mux_from`: $TESSERA_GENERATE_MUX=0).
    generate_mux: bool = True
    # mTLS to the agents: the files `tessera gateway` read from $TESSERA_TLS_DIR (None: none)
    tls: transport.TlsFiles | None = None
    # Requests held while no replica is awake (hold.py, issue 32): the bound and deadline.
    hold: hold_mod.HoldConfig = field(default_factory=hold_mod.HoldConfig)

    def __post_init__(self) -> None:
        if not self.routes_file and not (self.model_name and self.model_path):
            raise ValueError("model_name and model_path: required unless routes_file is given")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: {self.port} is outside [0, 65535]")
        if not self.host:
            raise ValueError("host: must not be empty")
        for name in ("poll_interval_s", "poll_timeout_s", "routes_check_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0")
        if not self.arrival_span_s > 0:
            raise ValueError("arrival_span_s: must be > 0")
        if self.failure_backoff_s < 0:
            raise ValueError("failure_backoff_s: must be >= 0")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes: must be >= 1024")
        ids = [r.replica_id for r in self.replicas]
        if len(set(ids)) != len(ids):
            raise ValueError(f"replicas: duplicate replica ids in {ids}")
