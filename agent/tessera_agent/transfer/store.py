"""The agent's rendezvous store: one TCPStore server per agent process, many groups on it.

`serve()` is called once by `server.py` when the agent starts; its address is reported by
`Describe` (`store_address`), and the plan hands the leader agent's address to every rank
of a replica in `LoadBlock`. Groups never clash on it: each formation uses its own key
prefix (`group.GroupSpec.name`), so replicas come and go without restarting anything.
"""

from __future__ import annotations

import datetime

from torch._C import _distributed_c10d as c10d


def serve(host: str = "127.0.0.1", port: int = 0) -> c10d.TCPStore:
    """Start a TCPStore server on `host:port` (0 = any free port; read `.port`)."""
    return c10d.TCPStore(
        host,
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=300),
        use_libuv=True,
    )


def connect(address: str, timeout_s: float) -> c10d.TCPStore:
    """A client of the store at `host:port`; waits up to `timeout_s` for keys it reads."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"store address {address!r} is not host:port")
    return c10d.TCPStore(
        host,
        int(port),
        is_master=False,
        timeout=datetime.timedelta(seconds=timeout_s),
        use_libuv=True,
    )
