"""`tessera status`'s layer-run table: replicated and migrated layers and where they are.

Asks every agent for `Describe` and lists each replicated run of a stage (CoCoServe
module scaling): the layers, every holder (`agent/device`), whether it is the run's home
(where an evicted replica's requests go back) and whether the stage's own copy migrated
away, the requests each serves, its measured speed and its bytes. Called by
`status_cmd.status`; prints nothing when no run exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc


def rows(
    addresses: Sequence[tuple[str, str]], tls: transport.TlsFiles | None, timeout: float = 5.0
) -> list[list[str]]:
    """One row per holder of every run of the agents' stages."""
    out: list[list[str]] = []
    for name, address in addresses:
        try:
            d = pb_grpc.AgentStub(transport.sync_channel(address, tls)).Describe(
                pb.DescribeRequest(), timeout=timeout
            )
        except grpc.RpcError:
            continue  # the agents table already says it is unreachable
        for run in d.scaling_runs:
            for h in run.holders:
                role = "home" if h.home else "replica"
                if h.home and run.origin == "migrated":
                    role = f"home (migrated from {name})"
                out.append(
                    [
                        run.replica_id,
                        str(run.stage_index),
                        f"[{run.layer_start}, {run.layer_end})",
                        h.name,
                        role,
                        str(h.requests),
                        f"{h.tokens_per_s:.0f}",
                        f"{h.param_bytes / 2**20:.1f}",
                        f"{h.kv_bytes / 2**20:.1f}",
                    ]
                )
    return out


def print_runs(
    console: Any, addresses: Sequence[tuple[str, str]], tls: transport.TlsFiles | None
) -> None:
    from rich.table import Table

    found = rows(addresses, tls)
    if not found:
        return
    table = Table(title="layer runs (module scaling)")
    for col in (
        "replica",
        "stage",
        "layers",
        "holder",
        "role",
        "requests",
        "tokens/s",
        "params MiB",
        "KV MiB",
    ):
        table.add_column(col)
    for r in found:
        table.add_row(*r)
    console.print(table)
